"""Where pretrained model-zoo weights live: ``<root>/<name>-<first 8 hex digits of its sha1>.params``, root
defaulting to ``$MXNET_HOME/models`` (``~/.mxnet/models``), as in MXNet 1.9.1's ``model_store``.
Layer: gluon; imports the standard library only.

dnnbind never downloads: a missing file fails at once, naming the file, the folder to put it in and the URL MXNet
would have fetched it from (a zip holding that one file). A file whose sha1 is not the published one (MXNet would
download it again) is used anyway, with a warning: offline there is nothing better to load, it may be the user's
own weights saved under that name, and load_parameters still checks every name and shape.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings

__all__ = ["get_model_file", "purge", "short_hash"]

# MXNet 1.9.1's table of the published files (python/mxnet/gluon/model_zoo/model_store.py): name -> sha1.
_model_sha1 = {
    "alexnet": "44335d1f0046b328243b32a26a4fbd62d9057b45",
    "densenet121": "f27dbf2dbd5ce9a80b102d89c7483342cd33cb31",
    "densenet161": "b6c8a95717e3e761bd88d145f4d0a214aaa515dc",
    "densenet169": "2603f878403c6aa5a71a124c4a3307143d6820e9",
    "densenet201": "1cdbc116bc3a1b65832b18cf53e1cb8e7da017eb",
    "inceptionv3": "ed47ec45a937b656fcc94dabde85495bbef5ba1f",
    "mobilenet0.25": "9f83e440996887baf91a6aff1cccc1c903a64274",
    "mobilenet0.5": "8e9d539cc66aa5efa71c4b6af983b936ab8701c3",
    "mobilenet0.75": "529b2c7f4934e6cb851155b22c96c9ab0a7c4dc2",
    "mobilenet1.0": "6b8c5106c730e8750bcd82ceb75220a3351157cd",
    "mobilenetv2_1.0": "36da4ff1867abccd32b29592d79fc753bca5a215",
    "mobilenetv2_0.75": "e2be7b72a79fe4a750d1dd415afedf01c3ea818d",
    "mobilenetv2_0.5": "aabd26cd335379fcb72ae6c8fac45a70eab11785",
    "mobilenetv2_0.25": "ae8f9392789b04822cbb1d98c27283fc5f8aa0a7",
    "resnet18_v1": "a0666292f0a30ff61f857b0b66efc0228eb6a54b",
    "resnet34_v1": "48216ba99a8b1005d75c0f3a0c422301a0473233",
    "resnet50_v1": "0aee57f96768c0a2d5b23a6ec91eb08dfb0a45ce",
    "resnet101_v1": "d988c13d6159779e907140a638c56f229634cb02",
    "resnet152_v1": "671c637a14387ab9e2654eafd0d493d86b1c8579",
    "resnet18_v2": "a81db45fd7b7a2d12ab97cd88ef0a5ac48b8f657",
    "resnet34_v2": "9d6b80bbc35169de6b6edecffdd6047c56fdd322",
    "resnet50_v2": "ecdde35339c1aadbec4f547857078e734a76fb49",
    "resnet101_v2": "18e93e4f48947e002547f50eabbcc9c83e516aa6",
    "resnet152_v2": "f2695542de38cf7e71ed58f02893d82bb409415e",
    "squeezenet1.0": "264ba4970a0cc87a4f15c96e25246a1307caf523",
    "squeezenet1.1": "33ba0f93753c83d86e1eb397f38a667eaf2e9376",
    "vgg11": "dd221b160977f36a53f464cb54648d227c707a05",
    "vgg11_bn": "ee79a8098a91fbe05b7a973fed2017a6117723a8",
    "vgg13": "6bc5de58a05a5e2e7f493e2d75a580d83efde38c",
    "vgg13_bn": "7d97a06c3c7a1aecc88b6e7385c2b373a249e95e",
    "vgg16": "e660d4569ccb679ec68f1fd3cce07a387252a90a",
    "vgg16_bn": "7f01cf050d357127a73826045c245041b0df7363",
    "vgg19": "ad2f660d101905472b83590b59708b71ea22b2e5",
    "vgg19_bn": "f360b758e856f1074a85abd5fd873ed1d98297c3",
}

APACHE_REPO_URL = "https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/"


class ModelFileMismatchWarning(UserWarning):
    """A pretrained file's sha1 is not the one MXNet published for that name (it is loaded all the same)."""


def _data_dir() -> str:
    # MXNet's mx.base.data_dir(), read on each call (MXNet fixes it at import) so that setting MXNET_HOME in a
    # script works. Not imported from gluon.data, which this module has no reason to load.
    if platform.system() == "Windows":
        default = os.path.join(os.environ.get("APPDATA", ""), "mxnet")
    else:
        default = os.path.join(os.path.expanduser("~"), ".mxnet")
    return os.getenv("MXNET_HOME", default)


def default_root() -> str:
    """``$MXNET_HOME/models`` (``~/.mxnet/models`` without MXNET_HOME): where pretrained files are looked for."""
    return os.path.join(_data_dir(), "models")


def short_hash(name: str) -> str:
    """The first 8 hex digits of the published file's sha1, as in its file name."""
    if name not in _model_sha1:
        raise ValueError(f"Pretrained model for {name} is not available.")
    return _model_sha1[name][:8]


def _sha1(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def get_model_file(name: str, root=None) -> str:
    """Path of the pretrained file of ``name`` under ``root`` (default ``$MXNET_HOME/models``).

    FileNotFoundError, at once, when it is not there (dnnbind does not download; the message says where MXNet
    would have fetched it). A file whose sha1 differs from MXNet's published one is returned with a
    ModelFileMismatchWarning.
    """
    file_name = f"{name}-{short_hash(name)}"
    folder = os.path.abspath(os.path.expanduser(os.fspath(root if root is not None else default_root())))
    path = os.path.join(folder, file_name + ".params")
    if not os.path.isfile(path):
        repo = os.environ.get("MXNET_GLUON_REPO", APACHE_REPO_URL)
        repo = repo if repo.endswith("/") else repo + "/"
        raise FileNotFoundError(
            f"pretrained {name}: {file_name}.params is not in {folder}. dnnbind does not download: put the file "
            f"there (MXNet would fetch {repo}gluon/models/{file_name}.zip and unpack {file_name}.params from it), "
            "set MXNET_HOME to the folder that holds models/, or pass root=.")
    found = _sha1(path)
    if found != _model_sha1[name]:
        warnings.warn(f"{path}: its sha1 is {found}, not {_model_sha1[name]} (the file MXNet publishes for {name}; "
                      "MXNet would download it again). dnnbind loads it as it is.", ModelFileMismatchWarning,
                      stacklevel=2)
    return path


def purge(root=None) -> None:
    """Delete every ``.params`` file in ``root`` (default ``$MXNET_HOME/models``), as MXNet's ``purge``."""
    folder = os.path.expanduser(os.fspath(root if root is not None else default_root()))
    for f in os.listdir(folder):
        if f.endswith(".params"):
            os.remove(os.path.join(folder, f))
