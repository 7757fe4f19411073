"""The skorch network that trains and holds a :class:`LocusNetwork`.

:class:`~sklocus.LocusEmbedder` keeps the scikit-learn face (parameters, checks,
``fit``, ``transform``); this module turns its parameters into a skorch
``NeuralNet`` with the collators, validation split and callbacks of
:mod:`sklocus.nn.training`, and strips what only training needs once it is done.
:func:`sklocus.load` rebuilds a fitted network through :func:`locus_network`.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from skorch import NeuralNet
from skorch.callbacks import EarlyStopping

from sklocus._progress import say
from sklocus.nn.network import LocusNetwork
from sklocus.nn.training import (
    EpochProgress,
    EpochTable,
    MaskedBCEWithLogitsLoss,
    ModelSplit,
    QueryNoiseSchedule,
    SetCollator,
    StopOnNonFiniteLoss,
)

# Parameters that shape the network: fine-tuning (warm_start) must keep them.
ARCHITECTURE = (
    "embedding_dim",
    "n_latents",
    "n_layers",
    "n_heads",
    "prior_tokens",
    "predictor_hidden",
)
# Fixed draws of each validation model in the validation loss: two halve the cost
# of four, which a fit on thousands of models does not need to rank epochs.
VALIDATION_DRAWS = 2


def locus_network(module_params, device, module=None, criterion=None, **settings):
    """Build the skorch network around :class:`LocusNetwork` (or ``module``).

    ``fit`` builds it with its training settings; :func:`sklocus.load` rebuilds a
    fitted one from its ``module_params`` (``LocusNetwork``'s arguments) alone.
    """
    module_args = {f"module__{name}": value for name, value in module_params.items()}
    if torch.device(device).type == "cuda":
        # One fused kernel per step for all the weights; the default runs
        # several per weight, and a step's time on a GPU went mostly to them.
        settings.setdefault("optimizer__fused", True)
    return NeuralNet(
        module=module or LocusNetwork,
        **module_args,
        criterion=criterion or MaskedBCEWithLogitsLoss,
        optimizer=torch.optim.AdamW,
        predict_nonlinearity=None,
        device=device,
        **settings,
    )


def release_training_state(net):
    """Drop what only training needs from a trained skorch network.

    The collators hold every training model's queries, scores and query vectors
    (about 19 bytes per evaluation, and anyone holding a pickle could read the
    scores back), the optimiser holds two moments per weight, and early stopping
    a copy of the best weights, already loaded. Inference needs the module, and
    users the history; fine-tuning builds a new network from the module's weights.
    """
    net.iterator_train__collate_fn = None
    net.iterator_valid__collate_fn = None
    net.train_split = None
    net.optimizer_ = None
    for _, callback in getattr(net, "callbacks_", []):
        if hasattr(callback, "best_model_weights_"):
            callback.best_model_weights_ = None


def validation_query_mask(n_queries, params, schedule, seed):
    """Training queries (True) and queries held out for validation (False).

    None when the fit holds out no query: no validation (``schedule[0]`` is
    None) or ``validation_queries=0``.
    """
    if schedule[0] is None or params["validation_queries"] <= 0:
        return None
    n_held = int(round(params["validation_queries"] * n_queries))
    mask = np.ones(n_queries, dtype=bool)
    rng = np.random.default_rng((seed, 1))
    mask[rng.choice(n_queries, size=n_held, replace=False)] = False
    return mask


def training_network(params, ragged, vectors, *, seed, schedule, device):
    """Build the skorch network that trains a LOCUS network on ``ragged``.

    Parameters
    ----------
    params : dict
        The :class:`~sklocus.LocusEmbedder` parameters (``get_params(deep=False)``).
    ragged : RaggedEvaluations
        The training sets.
    vectors : ndarray of shape (n_queries, query_dim)
        Encodings of ``ragged.queries``.
    seed : int
        Seed of the batches' draws and of the held-out queries.
    schedule : tuple
        ``(validation_fraction, max_epochs, epoch_size)``, resolved.
    device : str

    Returns
    -------
    skorch.NeuralNet
        Not initialised.
    """
    callbacks = []
    if params["verbose"]:
        # First, so that its line is ended before early stopping's message.
        callbacks.append(("epoch_progress", EpochProgress()))
    callbacks += [
        ("query_noise", QueryNoiseSchedule(*params["query_noise"])),
        ("non_finite_loss", StopOnNonFiniteLoss()),
    ]
    train_split = None
    fraction, max_epochs, epoch_size = schedule
    if fraction is not None:
        train_split = ModelSplit(
            fraction,
            seed,
            draws=VALIDATION_DRAWS,
            epoch_size=epoch_size,
        )
        callbacks.append(
            (
                "early_stopping",
                EarlyStopping(
                    monitor="valid_loss",
                    patience=params["patience"],
                    load_best=True,
                    sink=say,
                ),
            )
        )
    # Copies: fit must leave the user's callback objects (parameters of this
    # estimator) as they were, and two fits must not share their state.
    callbacks.extend(copy.deepcopy(list(params["callbacks"] or [])))
    sampling = (ragged, vectors, params["encoder_sizes"], params["decoder_size"], seed)
    query_mask = validation_query_mask(len(ragged.queries), params, schedule, seed)
    module_params = {name: params[name] for name in ARCHITECTURE}
    return locus_network(
        dict(module_params, query_dim=vectors.shape[1], dropout=params["dropout"]),
        device,
        module=params["module"],
        criterion=params["criterion"],
        lr=params["lr"],
        optimizer__weight_decay=params["weight_decay"],
        optimizer__param_groups=[("predictor.*", {"lr": params["predictor_lr"]})],
        max_epochs=max_epochs,
        batch_size=params["batch_size"],
        iterator_train__shuffle=True,
        iterator_train__collate_fn=SetCollator(*sampling, query_mask=query_mask),
        iterator_valid__collate_fn=SetCollator(
            *sampling, fixed=True, query_mask=query_mask
        ),
        train_split=train_split,
        callbacks=callbacks,
        # skorch's own table prints on standard output.
        callbacks__print_log=EpochTable(sink=say),
        verbose=params["verbose"],
    )
