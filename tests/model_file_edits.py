"""Edit a saved model file as an attacker would: its checksum stays valid."""

import json

from safetensors import safe_open
from safetensors.numpy import save_file

import sklocus._persistence
from sklocus._router._stages import STAGES


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


def holder(header, name):
    """The node of a saved router that holds its fitted attribute ``name``.

    Its own attributes are under ``fitted``; those of its stages (format 9)
    under the stage's node of ``stages``.
    """
    estimator = header["estimator"]
    for node in [estimator["fitted"], *estimator.get("stages", {}).values()]:
        if node is not None and name in node:
            return node
    raise KeyError(name)


def network(header):
    """The description of a saved router's network."""
    embedder = holder(header, "embedder_")["embedder_"]["estimator"]
    return embedder["fitted"]["net_"]["network"]


def set_module_param(header, name, value):
    """Set one of LocusNetwork's arguments in a saved router's description."""
    for pair in network(header)["module_params"]["dict"]:
        if pair[0] == name:
            pair[1] = value


def as_format_8(header):
    """Describe a saved router as model file format 8 did: its attributes flat."""
    estimator = header["estimator"]
    for name, node in estimator.pop("stages", {}).items():
        # A stage not fitted: each of its attributes None.
        estimator["fitted"].update(node or dict.fromkeys(STAGES[name].ATTRIBUTES))
    header["format_version"] = 8
