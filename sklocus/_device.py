"""Choice of the torch device, shared by every estimator that runs torch."""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device) -> str:
    """Turn ``"auto"`` into ``"cuda"`` when a GPU is available, else ``"cpu"``.

    Any other value is returned as a string after torch has checked it names a
    device, so that a typo fails here rather than deep inside a forward pass.
    """
    if isinstance(device, str) and device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"device={device!r} is not a torch device; expected 'auto', 'cpu', "
            "'cuda' or 'cuda:N'"
        ) from error
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={device!r} asks for a CUDA GPU, but torch sees none (this "
                f"torch is {torch.__version__}); use device='cpu' or 'auto'"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device={device!r}: torch sees {torch.cuda.device_count()} CUDA "
                f"device(s), numbered from 0"
            )
    return str(resolved)
