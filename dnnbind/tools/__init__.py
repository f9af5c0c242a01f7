"""Command-line tools MXNet ships in tools/: ``python -m dnnbind.tools.im2rec``. Layer: top (programs)."""
