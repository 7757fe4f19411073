"""Edit a saved model file as an attacker would: its checksum stays valid."""

import json

from safetensors import safe_open
from safetensors.numpy import save_file

import sklocus._persistence


def rewrite(path, edit, edit_arrays=None):
    """Rewrite a model file with ``edit`` (and ``edit_arrays``), keeping a valid checksum."""
    with safe_open(path, "np") as file:
        arrays = {key: file.get_tensor(key) for key in file.keys()}
        header = json.loads(file.metadata()["sklocus"])
    edit(header)
    if edit_arrays is not None:
        edit_arrays(arrays)
    header["sha256"] = sklocus._persistence._checksum(header["estimator"], arrays)
    save_file(arrays, path, metadata={"sklocus": json.dumps(header)})


def network(header):
    """The description of a saved router's network."""
    embedder = header["estimator"]["fitted"]["embedder_"]["estimator"]
    return embedder["fitted"]["net_"]["network"]


def set_module_param(header, name, value):
    """Set one of LocusNetwork's arguments in a saved router's description."""
    for pair in network(header)["module_params"]["dict"]:
        if pair[0] == name:
            pair[1] = value
