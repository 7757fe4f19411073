"""The skorch glue: data sets of models, collation, loss, split and schedule.

The unit of a training batch is a model. Each time a model is drawn, a random
subset of its evaluations of random size builds its embedding (the encoder subset)
and other evaluations of it give the targets (the decoder batch), as METHOD.md
describes; varying the subset size lets one encoder serve any number of evaluations.
"""

from __future__ import annotations

import contextlib
import signal
import threading

import numpy as np
import torch
from skorch.callbacks import Callback, PrintLog
from skorch.dataset import get_len
from skorch.utils import Ansi
from torch import nn
from torch.utils.data import Dataset

from sklocus import _progress
from sklocus._progress import Progress
from sklocus.nn.batching import pad


class ModelSetDataset(Dataset):
    """Models as samples: each item is ``(model index, draw)``.

    The split of each model's evaluations happens in :class:`SetCollator`, which
    sees the whole batch; ``draw`` numbers the fixed splits of a validation model.

    Parameters
    ----------
    models : ndarray of int
        The models (set indices) this data set serves.
    draws : int, default=1
        Items per model (fixed validation splits use several, for a steadier loss).
    """

    def __init__(self, models, draws=1):
        self.models = np.asarray(models)
        self.draws = draws

    def __len__(self):
        return len(self.models) * self.draws

    def __getitem__(self, i):
        return int(self.models[i % len(self.models)]), i // len(self.models)


def draws_per_model(n_models, epoch_size):
    """Draws of each model per epoch, so that an epoch has ``epoch_size`` or more.

    Every draw takes a fresh encoder subset and decoder batch, so drawing a model
    several times in an epoch is new data, not repetition; it keeps an epoch (and
    so early stopping's patience) a similar number of steps whatever the pool size.
    """
    return max(1, -(-epoch_size // n_models))


class SetCollator:
    """Split each model of a batch into encoder subset and decoder batch, and pad.

    One encoder-subset size is drawn per batch, log-uniformly from
    ``encoder_sizes``, and each model of the batch uses it (or all but one of its
    evaluations, if it has fewer): models of one batch then need almost no padding,
    which makes a step several times cheaper than with one size per model, while
    successive batches still cover the whole range of sizes. The decoder batch is
    drawn from the evaluations left out of the encoder subset, so the predictor
    learns to predict queries the embedding has not seen.

    Parameters
    ----------
    ragged : RaggedEvaluations
        All models' evaluations.
    query_vectors : ndarray of shape (n_queries, query_dim), float32
        Encoding of each of ``ragged.queries``.
    encoder_sizes : tuple of (int, int)
        Range of encoder-subset sizes.
    decoder_size : int
        Largest decoder batch per model.
    seed : int
        Seeds the draws.
    fixed : bool, default=False
        Give each (model, draw) the same split at every call, whatever its batch,
        with every evaluation left out of the encoder subset as a target (for
        validation).
    query_mask : ndarray of bool, shape (n_queries,), default=None
        Training queries (``True``) and validation queries (``False``). Training
        draws use training queries only; a validation draw embeds a model from its
        training queries and predicts all its validation queries, so the validation
        loss measures what onboarding needs: new models on new queries.
    """

    def __init__(
        self,
        ragged,
        query_vectors,
        encoder_sizes,
        decoder_size,
        seed,
        fixed=False,
        query_mask=None,
    ):
        self.ragged = ragged
        self.query_vectors = torch.as_tensor(query_vectors)
        self.encoder_sizes = encoder_sizes
        self.decoder_size = decoder_size
        self.seed = seed
        self.fixed = fixed
        self.query_mask = query_mask
        self.rng = np.random.default_rng(seed)

    def _draw_size(self, rng):
        low, high = self.encoder_sizes
        return int(np.exp(rng.uniform(np.log(low), np.log(high + 1))))

    def _split(self, model, size, rng, n_targets):
        codes = self.ragged.set_codes(model)
        scores = self.ragged.set_scores(model)
        if self.query_mask is not None:
            usable = self.query_mask[codes]
            if self.fixed and usable.any() and not usable.all():
                inputs, targets = np.flatnonzero(usable), np.flatnonzero(~usable)
                size = min(max(size, self.encoder_sizes[0]), self.encoder_sizes[1])
                inputs = rng.permutation(inputs)[:size]
                return codes[inputs], scores[inputs], codes[targets], scores[targets]
            if not self.fixed and usable.any():
                codes, scores = codes[usable], scores[usable]
        n = len(codes)
        if n == 1:  # nothing to hold out: the one evaluation is input and target
            return codes, scores, codes, scores
        size = min(max(size, self.encoder_sizes[0]), self.encoder_sizes[1], n - 1)
        order = rng.permutation(n)
        stop = n if n_targets is None else size + n_targets
        encoder, decoder = order[:size], order[size:stop]
        return codes[encoder], scores[encoder], codes[decoder], scores[decoder]

    def __call__(self, items):
        """Make the padded inputs and NaN-padded targets of a batch of models."""
        splits = []
        size = self._draw_size(self.rng)
        for model, draw in items:
            if self.fixed:
                rng = np.random.default_rng((self.seed, model, draw))
                size = self._draw_size(rng)
                splits.append(self._split(model, size, rng, n_targets=None))
            else:
                splits.append(self._split(model, size, self.rng, self.decoder_size))
        encoder_codes, encoder_scores, decoder_codes, decoder_scores = zip(*splits)
        # The batch's distinct queries become its query table, projected once per
        # step by the network however many models share them.
        distinct, local = np.unique(
            np.concatenate(encoder_codes + decoder_codes), return_inverse=True
        )
        bounds = np.cumsum([len(c) for c in encoder_codes + decoder_codes])[:-1]
        local = np.split(local, bounds)
        n = len(encoder_codes)
        codes, mask = pad(local[:n], 0, torch.long)
        scores, _ = pad(encoder_scores, 0.0, torch.float32)
        targets_codes, _ = pad(local[n:], 0, torch.long)
        targets, _ = pad(decoder_scores, np.nan, torch.float32)
        # skorch wants one row per model in every input, so the table travels
        # split into `n` rows of equal length (zero rows at the end pad it).
        width = -(-len(distinct) // n)
        table = torch.zeros(n * width, self.query_vectors.shape[1])
        table[: len(distinct)] = self.query_vectors[torch.from_numpy(distinct)]
        inputs = {
            "query_table": table.view(n, width, -1),
            "encoder_codes": codes,
            "encoder_scores": scores,
            "encoder_mask": mask,
            "decoder_codes": targets_codes,
        }
        return inputs, targets


class MaskedBCEWithLogitsLoss(nn.Module):
    """Binary cross-entropy over the real targets; NaN targets are padding."""

    def forward(self, logits, targets):
        """Mean loss over the non-NaN targets.

        Parameters
        ----------
        logits : Tensor of shape (batch, n_decoder)
        targets : Tensor of shape (batch, n_decoder)
            Scores in [0, 1], NaN for padding.

        Returns
        -------
        Tensor
            Scalar loss.
        """
        real = ~torch.isnan(targets)
        return nn.functional.binary_cross_entropy_with_logits(
            logits[real], targets[real]
        )


class ModelSplit:
    """skorch ``train_split`` that holds out whole models for validation.

    With ``fraction=0`` no model is held out: every model trains and every model
    validates, which only makes sense with a collator whose ``query_mask`` keeps
    some queries out of training (the validation loss is then that of the
    training models on held-out queries, the steadier signal on a small pool).

    Parameters
    ----------
    fraction : float
        Fraction of the models held out (at least one), or 0 for none.
    seed : int
        Seeds the choice of models.
    draws : int, default=4
        Fixed splits of each validation model, averaged in the validation loss.
    epoch_size : int, default=1
        Least number of model draws in a training epoch (see
        :func:`draws_per_model`).
    """

    def __init__(self, fraction, seed, draws=4, epoch_size=1):
        self.fraction = fraction
        self.seed = seed
        self.draws = draws
        self.epoch_size = epoch_size

    def __call__(self, dataset, y=None, **fit_params):
        """Split a :class:`ModelSetDataset` into training and validation models."""
        if self.fraction == 0:
            valid = train = dataset.models
        else:
            models = np.random.default_rng(self.seed).permutation(dataset.models)
            n_valid = max(1, int(round(self.fraction * len(models))))
            if n_valid >= len(models):
                raise ValueError(
                    f"validation_fraction={self.fraction} holds out {n_valid} of "
                    f"the {len(models)} training models, leaving none to train on; "
                    "lower it or set validation_fraction=None"
                )
            valid, train = np.sort(models[:n_valid]), np.sort(models[n_valid:])
        training = ModelSetDataset(train, draws_per_model(len(train), self.epoch_size))
        return training, ModelSetDataset(valid, draws=self.draws)


class QueryNoiseSchedule(Callback):
    """Anneal the training noise on query encodings linearly across epochs.

    Parameters
    ----------
    start, end : float
        Noise standard deviation at the first and the last epoch.
    """

    def __init__(self, start, end):
        self.start = start
        self.end = end

    def on_epoch_begin(self, net, **kwargs):
        """Set the noise of the coming epoch on the module."""
        epochs = max(net.max_epochs - 1, 1)
        progress = min(len(net.history) - 1, epochs) / epochs
        net.module_.query_noise = self.start + (self.end - self.start) * progress


class StopOnNonFiniteLoss(Callback):
    """Stop training with a clear error as soon as a batch's loss is not finite.

    Without it a diverged fit carries on and leaves NaN weights, whose embeddings
    are NaN without a word.
    """

    def on_batch_end(self, net, batch=None, training=None, **kwargs):
        """Check the loss skorch has just recorded for this batch."""
        key = "train_loss" if training else "valid_loss"
        loss = net.history[-1, "batches", -1, key]
        if not np.isfinite(loss):
            epoch = len(net.history)
            phase = "training" if training else "validation"
            raise FloatingPointError(
                f"the {phase} loss became {loss} in epoch {epoch}; the fit "
                f"diverged. Lower the learning rates (lr={net.lr:g}) or "
                "predictor_lr, or raise weight_decay"
            )


# On a terminal an epoch's line shows once the epoch has lasted this long (as
# the embedder's other steps do): a shorter one is not worth a line, and one
# drawn after a second leaves no silence of two.
_EPOCH_DELAY = 1.0


class EpochProgress(Callback):
    """Report how far each epoch has come, through :class:`~sklocus._progress.Progress`.

    skorch's table of epochs gains a row only when an epoch ends, which on a
    large pool is minutes of silence. On a terminal, an epoch that lasts a
    second is one line redrawn in place (``Epoch 2 of 10: 45/136 batches
    (33%), 9 s``), cleared when the row comes. In a log, an epoch that lasts
    :data:`~sklocus._progress._LINE_SECONDS` writes plain lines as other long
    steps do, so that a short one leaves only its row. Training and validation
    batches both count, as both take the epoch's time.
    """

    def __init__(self):
        self.progress_ = None

    def on_epoch_begin(self, net, dataset_train=None, dataset_valid=None, **kwargs):
        """Start the epoch's step, counting its training and validation batches."""
        self.end()
        batches = 0
        for dataset, iterator in (
            (dataset_train, "iterator_train"),
            (dataset_valid, "iterator_valid"),
        ):
            if dataset is not None:
                size = net.get_params().get(f"{iterator}__batch_size", net.batch_size)
                batches += -(-get_len(dataset) // size)
        self.progress_ = Progress(
            f"Epoch {len(net.history)} of {net.max_epochs}",
            batches,
            "batch",
            delay=_EPOCH_DELAY,
            log_delay=_progress._LINE_SECONDS,
            says_end=False,
        ).__enter__()

    def on_batch_end(self, net, **kwargs):
        """Count one more batch."""
        if self.progress_ is not None:
            self.progress_.advance()

    def on_epoch_end(self, net, **kwargs):
        """End the epoch's step before skorch prints its row."""
        self.end()

    def on_train_end(self, net, **kwargs):
        """End a step that an interrupt cut short, keeping how far it came."""
        self.end(KeyboardInterrupt)

    def end(self, error=None):
        """End the epoch's step, if one runs; ``error``, the exception that ended it.

        Training that fails with an exception reaches no callback, so whoever
        called ``fit`` ends the step; until then it would be redrawn below the
        error.
        """
        progress, self.progress_ = self.progress_, None
        if progress is not None:
            progress.__exit__(error, None, None)


def end_epoch_progress(net, error):
    """End ``net``'s epoch progress after ``error`` stopped training mid-epoch."""
    for _, callback in getattr(net, "callbacks_", []):
        if isinstance(callback, EpochProgress):
            callback.end(type(error))


# Why a fit's training ended, as LocusEmbedder.stop_reason_ says it.
STOP_REASONS = ("early_stopping", "max_epochs", "max_epochs_improving", "callback")
# At the epoch cap, more epochs are worth their time only while the validation
# loss still falls clearly: by more than FALLING_TOLERANCE of itself an epoch,
# on average over the last FALLING_WINDOW epochs. One epoch's change is mostly
# the noise of training (the validation draws are fixed), which three average
# out; and at 0.3% an epoch, doubling a cap of 8 epochs gains at most about 2%
# of the loss, less as the curve flattens. Early stopping's own threshold
# (1e-4) only tells whether the last epoch was the best, which a loss creeping
# down nearly always is: it asked for more epochs after every fit.
FALLING_WINDOW = 3
FALLING_TOLERANCE = 0.003


def recent_fall(valid_losses):
    """Mean relative fall of the validation loss an epoch, over the last epochs.

    Over the last :data:`FALLING_WINDOW` epochs (fewer in a shorter history):
    ``(loss then - last loss) / epochs / last loss``. Positive while the loss
    falls.

    Parameters
    ----------
    valid_losses : sequence of float
        The validation loss of each epoch, in order.

    Returns
    -------
    float or None
        None with fewer than two epochs, which have nothing to compare.
    """
    losses = [float(loss) for loss in valid_losses]
    if len(losses) < 2:
        return None
    window = min(FALLING_WINDOW, len(losses) - 1)
    last = losses[-1]
    return (losses[-1 - window] - last) / window / max(abs(last), 1e-12)


def still_falling(valid_losses):
    """Whether more epochs would pay: the loss falls clearly, and last is best.

    True when the last epoch has the lowest validation loss of all and
    :func:`recent_fall` exceeds :data:`FALLING_TOLERANCE`; False when the loss
    has flattened, turned, or there are fewer than two epochs.

    Parameters
    ----------
    valid_losses : sequence of float
        The validation loss of each epoch, in order.

    Returns
    -------
    bool
    """
    fall = recent_fall(valid_losses)
    if fall is None or min(valid_losses) < valid_losses[-1]:
        return False
    return fall > FALLING_TOLERANCE


def stop_reason(net):
    """Return why ``net``'s training ended: one of :data:`STOP_REASONS`.

    ``"early_stopping"`` when the validation loss had not improved for
    ``patience`` epochs; ``"max_epochs_improving"`` when training reached its
    cap while the validation loss still fell clearly (:func:`still_falling`),
    where more epochs may fit better; ``"max_epochs"`` at the cap otherwise:
    the loss had flattened or turned, there was no validation, or a single
    epoch (which has nothing to compare); ``"callback"`` when another
    callback ended it sooner.
    """
    early = dict(getattr(net, "callbacks_", [])).get("early_stopping")
    if early is not None and early.misses_ >= early.patience:
        return "early_stopping"
    if len(net.history) < net.max_epochs:
        return "callback"
    if early is not None and still_falling(net.history[:, "valid_loss"]):
        return "max_epochs_improving"
    return "max_epochs"


class EpochTable(PrintLog):
    """skorch's table of epochs, written as every other line of a fit.

    Built with ``sink=say`` (:func:`~sklocus._progress.say`), its rows go where the
    epoch's progress and every step's line do: to standard error, which leaves
    standard output to the data, clearing a line being redrawn first. On a
    terminal skorch's colours mark each best value; off one (a log, a pipe) they
    would stay as escape codes around the numbers, so the rows are plain.
    """

    def format_row(self, row, key, color):
        """Format one value of the table, coloured on a terminal only."""
        if _progress.on_terminal():
            return super().format_row(row, key, color)
        value = super().format_row(row, key, color="")
        return value.replace(Ansi.ENDC.value, "") if isinstance(value, str) else value


@contextlib.contextmanager
def interrupts_noticed():
    """Notice Ctrl-C while skorch trains, and yield a list that records it.

    skorch ends training quietly on ``KeyboardInterrupt``, because its callbacks
    (early stopping among them) raise it to stop; a user's Ctrl-C would then come
    back as a partly trained model. While this is active, SIGINT appends to the
    list before the usual handler raises, so the caller can tell a user's
    interrupt from a callback's stop and raise it again. Outside the main thread,
    where no signal arrives, it records nothing.
    """
    interrupted = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(
        previous
    ):
        yield interrupted
        return

    def notice(signum, frame):
        interrupted.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGINT, notice)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
