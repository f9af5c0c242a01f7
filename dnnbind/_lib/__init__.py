"""Layer 0, the raw C API: ctypes prototypes with C names, enums, status -> exception.

Imports nothing else of dnnbind. Importing this package loads no library and touches no GPU: every
library is opened by the first call that needs it (see loader.py).
"""
