"""LocusEmbedder: ragged evaluation sets in, one vector per model out."""

from __future__ import annotations

import numbers
import time

import numpy as np
import torch
from scipy.spatial.distance import pdist
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
)
from sklearn.cluster import KMeans
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from sklocus._device import resolve_device
from sklocus._progress import Progress, status
from sklocus._sklearn_compat import HasMethods, Interval, StrOptions, _fit_context
from sklocus._versioning import VersionStampMixin
from sklocus.encoders import SentenceEncoder, as_query_list, check_query_encoder
from sklocus.evaluations import RaggedEvaluations, check_evaluation_sets, reusable
from sklocus.geometry import check_embeddings
from sklocus.metrics import correctness_log_likelihood
from sklocus.nn.assembly import (
    ARCHITECTURE,
    release_training_state,
    training_network,
    validation_query_mask,
)
from sklocus.nn.inference import (
    PRECISIONS,
    embed_sets,
    max_tokens,
    refine_sets,
    score_own_queries,
    score_pairs,
)
from sklocus.nn.network import SIZE_LIMITS, LocusNetwork
from sklocus.nn.training import (
    ModelSetDataset,
    draws_per_model,
    end_epoch_progress,
    interrupts_noticed,
    stop_reason,
)

# Clusters of training queries that query_novelty measures distances to.
_QUERY_CLUSTERS = 32
# Pools of fewer models than this are small: the "auto" settings validate every
# model on held-out queries instead of holding out models (a tenth of a small
# pool is one to nine models, whose loss ranks epochs by which models they are),
# and train up to _SMALL_POOL_EPOCHS epochs of _SMALL_POOL_EPOCH_SIZE draws,
# about a minute and a half on 2 CPU cores: a router over a small pool leans on
# each model's own query heads (sklocus._router._heads) where its evaluations are
# many. 20 epochs of up to 4,096 draws (the schedule before 2026-12-03) routed
# no better for 5 to 7 times the time, nor did 10 epochs for a quarter more
# (docs/research/tuning.md).
_SMALL_POOL = 100
_SMALL_POOL_EPOCHS = 8
_SMALL_POOL_EPOCH_SIZE = 1024
_LARGE_POOL_EPOCHS = 10
_LARGE_POOL_EPOCH_SIZE = 4096
# Training models whose embeddings set embedding_scale_ (at most; chosen at random).
_SCALE_MODELS = 1024
# Adam's step size in test-time refinement (refine_steps).
_REFINE_STEP_SIZE = 0.05
# With verbose on, embedding and refinement report their progress once they have
# lasted this many seconds: a shorter step is not worth a line, and a step that
# reports after one second leaves no silence of two.
_PROGRESS_DELAY = 1.0
# score() holds out this fraction of each set to test the embedding built from the rest.
_SCORE_HOLDOUT = 0.25


def _summarise_queries(vectors, seed, previous=None):
    """Centres of the training queries' encodings and their 95% radius.

    ``query_novelty`` measures a query's distance to the nearest centre in units of
    the radius within which 95% of the training queries lie from theirs. After
    fine-tuning (``previous``: the fitted centres and radius) both query sets count.
    """
    n_clusters = min(_QUERY_CLUSTERS, len(vectors))
    kmeans = KMeans(n_clusters=n_clusters, n_init=1, random_state=seed).fit(vectors)
    distances = kmeans.transform(vectors).min(axis=1)
    centres = kmeans.cluster_centers_.astype(np.float32)
    radius = float(np.quantile(distances, 0.95))
    if previous is not None:
        centres = np.concatenate([previous[0], centres])
        radius = max(radius, previous[1])
    # Identical training queries leave a radius of 0; any new query is then novel.
    return centres, max(radius, np.finfo(np.float32).tiny)


def _check_refinement(steps, penalty):
    if not (isinstance(steps, numbers.Integral) and steps >= 0):
        raise ValueError(f"refine_steps={steps!r}; expected an integer >= 0")
    if not (isinstance(penalty, numbers.Real) and penalty > 0):
        raise ValueError(f"refine_penalty={penalty!r}; expected a number > 0")


def _size_interval(name, low):
    """Return the values a size argument of the network may take (SIZE_LIMITS)."""
    return Interval(numbers.Integral, low, SIZE_LIMITS[name], closed="both")


def _size_range(value):
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, numbers.Integral) and v >= 1 for v in value)
        and value[0] <= value[1]
    )


def _noise_range(value):
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, numbers.Real) and v >= 0 for v in value)
    )


def _plain(query):
    """Return a query id as a Python scalar (numpy's scalars as Python's)."""
    return query.item() if isinstance(query, np.generic) else query


class LocusEmbedder(
    VersionStampMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator
):
    """Embed language models from their scored evaluations (LOCUS).

    A set encoder maps each model's evaluation set (queries with scores) to one
    vector; a predictor maps a vector and a query to the probability that the model
    answers it correctly. Both are trained jointly by ``fit``; embedding a model is
    then one forward pass (``transform``), for any number of evaluations, on
    queries seen in training or not.

    The network is trained by a skorch :class:`~skorch.NeuralNet`, kept as ``net_``.

    Parameters
    ----------
    query_encoder : str or encoder, default="all-MiniLM-L6-v2"
        A sentence-transformers model name (made into a
        :class:`~sklocus.SentenceEncoder`) or any object whose
        ``transform(queries)`` returns one vector per query, such as
        :class:`~sklocus.PrecomputedEncoder`.
    embedding_dim : int, default=128
        Width of the embeddings (and of the tokens and latents inside the encoder).
    n_latents : int, default=64
        Learned latents per bottleneck layer.
    n_layers : int, default=2
        Latent-bottleneck layers.
    n_heads : int, default=4
        Attention heads; must divide ``embedding_dim``.
    prior_tokens : int, default=0
        Learned tokens the encoder adds to every evaluation set. Attention only
        averages, so the paper's encoder (0) embeds a set and the same set with
        every evaluation repeated alike; a learned token's share of each softmax
        shrinks as evaluations are added, which lets the embedding lean on a
        learned prior when evidence is thin. On 8 Open LLM pools one token raised
        correctness by 0.002-0.003 (sd 0.002) and left routing where it was; on
        synthetic data it separated planted duplicates worse
        (docs/research/tuning.md), so it is not the default.
    predictor_hidden : int, default=64
        Hidden width of the correctness predictor.
    encoder_sizes : tuple of (int, int), default=(8, 512)
        Range of encoder-subset sizes drawn (log-uniformly) for each model at each
        training step.
    decoder_size : int, default=64
        Evaluations of each model used as targets at each training step.
    max_epochs : "auto" or int, default="auto"
        Most training epochs; ``"auto"`` is 10, and 8 on pools of fewer than 100
        models (see ``epoch_size``). Early stopping often ends training
        sooner; the cap bounds the time of a fit: on the 5,949 Open LLM Leaderboard
        models an epoch takes 80-90 s on 2 CPU cores, and the held-out loss stops
        improving after 4-10 epochs (docs/research/tuning.md), so a default fit of
        all of them stays under 15 minutes.
    epoch_size : "auto" or int, default="auto"
        Least number of model draws in an epoch: every training model is drawn
        once, or several times when the pool is smaller than this (each draw takes
        a fresh subset, so a small pool still gets that many distinct examples).
        ``"auto"`` is 4,096 on pools of 100 models or more and 1,024 on smaller
        ones, so that a default fit of a small pool takes about a minute and a
        half on 2 CPU cores (the 9 LLMRouter models, 5,608 evaluations each: 76-99
        s). A router over a small pool leans on each model's own query heads
        where its evaluations are many (:class:`~sklocus.LocusRouter`'s
        ``query_heads``); on such pools, 20 epochs of up to 4,096 draws routed no
        better for 5 to 7 times the time (docs/research/budget.md). On 100
        synthetic models, 12 epochs of 4,096 draws take about 4.5 minutes on 2 CPU
        cores and separate families better than 12 epochs of 1,024 draws
        (docs/research/geometry-synthetic.md). A pool of more than 4,096 training
        models is drawn once per epoch whatever this is.
    batch_size : int, default=32
        Models per training step.
    lr : float, default=2e-4
        AdamW learning rate of the set encoder.
    predictor_lr : float, default=8e-4
        AdamW learning rate of the predictor.
    weight_decay : float, default=0.05
        AdamW weight decay.
    dropout : float, default=0.1
        Dropout during training.
    query_noise : tuple of (float, float), default=(0.20, 0.10)
        Standard deviation of the Gaussian noise on query encodings during training,
        annealed linearly from the first value to the second. It keeps the predictor
        from memorising the training queries; twice the reference code's (0.10,
        0.05), which predicted and routed worse on new queries of the Open LLM data
        (docs/research/tuning.md).
    validation_fraction : "auto", float or None, default="auto"
        What early stopping watches. A float in (0, 1) holds out that fraction of
        the *models* (at least one, and only from pools of 4 or more): the
        validation loss is theirs. 0 holds out no model: the validation loss is
        that of every training model on the held-out queries
        (``validation_queries``), which is what a team routing among its own
        models needs. ``"auto"`` is 0.1 on pools of 100 models or more and 0 on
        smaller ones, where a tenth of the pool is a handful of models whose loss
        ranks epochs by which models they are (docs/research/small-pools.md). ``None``
        trains for ``max_epochs`` with no validation.
    validation_queries : float, default=0.1
        Fraction of the *queries* kept out of training for validation: held-out
        models are embedded from their training queries and scored on these, the
        situation of onboarding. 0 validates held-out models on training queries
        (and is refused with ``validation_fraction=0``). A router with query
        heads chooses their blend on these queries, which the network never
        trained on (:class:`~sklocus.LocusRouter`'s ``query_heads``;
        ``validation_queries_``).
    patience : int, default=5
        Epochs without improvement of the validation loss before training stops.
    device : str, default="auto"
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``...
    inference_precision : {"float32", "bfloat16", "float16"}, default="float32"
        Precision of ``transform``, ``predict_correctness`` and ``score``: the
        16-bit choices run them under :func:`torch.autocast`, which is faster where
        the hardware has 16-bit matrix units (GPUs' tensor cores) and moves
        embeddings by a small relative amount (measured in docs/performance.md).
        Training is always float32. May be changed on a fitted embedder.
    refine_steps : int, default=0
        Steps of test-time refinement in ``transform`` (and so in ``score``): each
        model's forward-pass embedding is moved to explain the model's own
        evaluations better under the frozen predictor, with ``refine_penalty``
        keeping it near the forward pass (:mod:`sklocus.nn.refinement`). The result
        is still a deterministic, permutation-invariant function of the
        evaluation set, and no per-model parameter is stored. 0 embeds by the
        forward pass alone. May be changed on a fitted embedder.
    refine_penalty : float, default=0.1
        Weight of the squared distance to the forward-pass embedding against the
        summed log loss of the model's evaluations: the larger, the more
        evaluations it takes to move an embedding.
    module : subclass of :class:`~sklocus.nn.LocusNetwork` or None, default=None
        The network to train; ``None`` is ``LocusNetwork``. The seam for variants
        of the architecture: a subclass takes ``LocusNetwork``'s arguments and
        keeps its ``encoder`` and ``predictor``, which ``transform`` and
        ``predict_correctness`` call (``forward`` is used in training only, so
        it may return whatever ``criterion`` reads). An embedder with a custom
        module is code, not data: ``sklocus.save`` refuses it, joblib keeps it.
    criterion : torch loss class or None, default=None
        Training loss, called as ``criterion()(module output, targets)`` with
        NaN-padded targets of shape ``(batch, decoder_size)``; ``None`` is the
        masked binary cross-entropy of :mod:`sklocus.nn.training`. Early stopping
        monitors this loss. The same saving rule as ``module`` applies.
    warm_start : bool, default=False
        When ``True`` and the embedder is fitted, ``fit`` continues training the
        fitted network on the new evaluation sets (fine-tuning) instead of
        starting from a fresh one. The fitted query encoder is kept, and the
        parameters that shape the network (``embedding_dim``, ``n_latents``,
        ``n_layers``, ``n_heads``, ``prior_tokens``, ``predictor_hidden``) must be
        those it was fitted with. Optimiser state and training history start
        afresh.
    random_state : int or None, default=None
        Seeds the initialisation and every draw of training; ``fit`` leaves the
        global torch and numpy random states as it found them.
    callbacks : list of skorch callbacks or None, default=None
        Passed to the skorch ``NeuralNet``.
    verbose : int, default=0
        0 prints nothing, as scikit-learn's estimators do. 1 writes, on
        standard error (standard output is left to the data), skorch's table
        of epochs (a row as each ends) and each epoch's progress once it has
        lasted a second:
        a line redrawn on a terminal (``Epoch 2 of 10: 45/136 batches (33%),
        9 s``), cleared when the row comes; in a log, plain lines only for an
        epoch that lasts 10 seconds. It also reports the progress of embedding
        and refinement (``transform``, ``score``) once they have lasted a
        second, in the same way.

    Attributes
    ----------
    net_ : skorch.NeuralNet
        The trained network (``net_.module_`` is a :class:`~sklocus.nn.LocusNetwork`).
    query_encoder_ : encoder
        The query encoder used in ``fit`` and after.
    query_dim_ : int
        Width of the query encodings.
    device_ : str
        The device the network runs on.
    query_centroids_ : ndarray of shape (n_centres, query_dim)
        k-means centres of the training queries' encodings (of every fit, when
        fine-tuned), read by ``query_novelty``.
    query_radius_ : float
        Distance from their centre within which 95% of the training queries lie.
    validation_queries_ : list or None
        The queries held out of training for validation (``validation_queries``)
        that the network never trained on, in the order of the training queries;
        None when the fit held none out, and after fine-tuning (``warm_start``),
        which may have trained on any. A router chooses its query heads' blend on
        them, where LOCUS is not in-sample.
    stop_reason_ : str
        Why training ended: ``"early_stopping"`` (the validation loss had not
        improved for ``patience`` epochs), ``"max_epochs"`` (the cap was reached
        with the validation loss no longer falling, or with no validation),
        ``"max_epochs_improving"`` (the cap was reached while the validation loss
        still fell clearly: the last epoch was the best, and the loss fell by
        more than 0.3% of itself an epoch over the last three, so a larger
        ``max_epochs`` may fit better) or ``"callback"`` (one of ``callbacks``
        ended it). A loss that still creeps down at the cap is
        ``"max_epochs"``: more epochs would cost their time for little.
        ``sklocus fit`` says which, with a hint only for the one that pays.
    encoding_time_ : float
        Seconds ``fit`` spent encoding the training queries (the epochs' own
        durations are ``history_[:, "dur"]``).
    embedding_scale_ : float
        Median Euclidean distance between two training models' forward-pass
        embeddings (of up to 1,024 of them), in the network's own units.
        ``transform`` divides by it, so that in the embeddings it returns the
        typical distance between two models is about 1 whatever the network
        learnt, and a distance threshold means the same for every embedder
        (``sklocus.geometry.find_duplicates``); ``predict_correctness`` multiplies
        it back. A fixed number: embeddings do not change as models are added,
        and fine-tuning (``warm_start``) keeps the units of the first fit.

    Examples
    --------
    >>> from sklocus import LocusEmbedder
    >>> from sklocus.datasets import make_evaluations
    >>> data = make_evaluations(n_models=30, n_queries=200, evals_per_model=60,
    ...                         random_state=0)
    >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=16,
    ...                          n_latents=4, max_epochs=2, epoch_size=256,
    ...                          random_state=0)
    >>> embedder.fit_transform(data.evaluation_sets).shape
    (30, 16)
    """

    _parameter_constraints = {
        "query_encoder": [str, HasMethods(["transform"])],
        "embedding_dim": [_size_interval("embedding_dim", 1)],
        "n_latents": [_size_interval("n_latents", 1)],
        "n_layers": [_size_interval("n_layers", 0)],
        "n_heads": [_size_interval("n_heads", 1)],
        "prior_tokens": [_size_interval("prior_tokens", 0)],
        "predictor_hidden": [_size_interval("predictor_hidden", 1)],
        "encoder_sizes": [tuple],
        "decoder_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "max_epochs": [
            StrOptions({"auto"}),
            Interval(numbers.Integral, 1, None, closed="left"),
        ],
        "epoch_size": [
            StrOptions({"auto"}),
            Interval(numbers.Integral, 1, None, closed="left"),
        ],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "lr": [Interval(numbers.Real, 0, None, closed="neither")],
        "predictor_lr": [Interval(numbers.Real, 0, None, closed="neither")],
        "weight_decay": [Interval(numbers.Real, 0, None, closed="left")],
        "dropout": [Interval(numbers.Real, 0, 1, closed="left")],
        "query_noise": [tuple],
        "validation_fraction": [
            StrOptions({"auto"}),
            Interval(numbers.Real, 0, 1, closed="left"),
            None,
        ],
        "validation_queries": [Interval(numbers.Real, 0, 1, closed="left")],
        "patience": [Interval(numbers.Integral, 1, None, closed="left")],
        "device": [str, torch.device],
        "inference_precision": [StrOptions(set(PRECISIONS))],
        "refine_steps": [Interval(numbers.Integral, 0, None, closed="left")],
        "refine_penalty": [Interval(numbers.Real, 0, None, closed="neither")],
        "warm_start": ["boolean"],
        "module": [None, callable],
        "criterion": [None, callable],
        "random_state": ["random_state"],
        "callbacks": [list, None],
        "verbose": ["verbose"],
    }

    def __init__(
        self,
        query_encoder="all-MiniLM-L6-v2",
        *,
        embedding_dim=128,
        n_latents=64,
        n_layers=2,
        n_heads=4,
        prior_tokens=0,
        predictor_hidden=64,
        encoder_sizes=(8, 512),
        decoder_size=64,
        max_epochs="auto",
        epoch_size="auto",
        batch_size=32,
        lr=2e-4,
        predictor_lr=8e-4,
        weight_decay=0.05,
        dropout=0.1,
        query_noise=(0.20, 0.10),
        validation_fraction="auto",
        validation_queries=0.1,
        patience=5,
        device="auto",
        inference_precision="float32",
        refine_steps=0,
        refine_penalty=0.1,
        warm_start=False,
        module=None,
        criterion=None,
        random_state=None,
        callbacks=None,
        verbose=0,
    ):
        self.query_encoder = query_encoder
        self.embedding_dim = embedding_dim
        self.n_latents = n_latents
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.prior_tokens = prior_tokens
        self.predictor_hidden = predictor_hidden
        self.encoder_sizes = encoder_sizes
        self.decoder_size = decoder_size
        self.max_epochs = max_epochs
        self.epoch_size = epoch_size
        self.batch_size = batch_size
        self.lr = lr
        self.predictor_lr = predictor_lr
        self.weight_decay = weight_decay
        self.dropout = dropout
        self.query_noise = query_noise
        self.validation_fraction = validation_fraction
        self.validation_queries = validation_queries
        self.patience = patience
        self.device = device
        self.inference_precision = inference_precision
        self.refine_steps = refine_steps
        self.refine_penalty = refine_penalty
        self.warm_start = warm_start
        self.module = module
        self.criterion = criterion
        self.random_state = random_state
        self.callbacks = callbacks
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.dict = True
        tags.non_deterministic = self.random_state is None
        return tags

    # -- fitting ----------------------------------------------------------------

    def check_params(self):
        """Check the settings as :meth:`fit` does, without fitting.

        What a caller about to read a large pool, or to announce a long
        training, calls first: a bad setting (out of its range, or at odds with
        another) fails now, not after that work.

        Returns
        -------
        self

        Raises
        ------
        ValueError or TypeError
            Naming the setting at fault and what it takes.
        """
        self._validate_params()
        self._check_params()
        return self

    def _check_params(self):
        if not _size_range(self.encoder_sizes):
            raise ValueError(
                f"encoder_sizes={self.encoder_sizes!r} must be a tuple (low, high) of "
                "positive integers with low <= high"
            )
        if not _noise_range(self.query_noise):
            raise ValueError(
                f"query_noise={self.query_noise!r} must be a tuple (start, end) of "
                "non-negative numbers"
            )
        if self.validation_fraction == 0 and self.validation_queries == 0:
            raise ValueError(
                "validation_fraction=0 validates on held-out queries, but "
                "validation_queries=0 holds none out; hold out queries, models "
                "(validation_fraction > 0) or neither (validation_fraction=None)"
            )
        if self.embedding_dim % self.n_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must divide embedding_dim={self.embedding_dim}"
            )

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Train the set encoder and the predictor on evaluation sets.

        Parameters
        ----------
        X : sequence of mappings
            One mapping from query to score per model (see
            :mod:`sklocus.evaluations`).
        y : None
            Ignored; present for scikit-learn compatibility.

        Returns
        -------
        self
        """
        self._check_params()
        # Training sees the sets in one order whatever order they came in, so the
        # fitted model does not depend on it.
        ragged = check_evaluation_sets(X).in_canonical_order()
        previous = self._warm_start_network()
        if previous is None:
            encoder = self.query_encoder
            if isinstance(encoder, str):
                encoder = SentenceEncoder(model=encoder, device=self.device)
            self.query_encoder_ = check_query_encoder(encoder)
        start = time.perf_counter()
        vectors = self._encode(ragged.queries, fitted=previous is not None)
        # Apart from the epochs' own durations in history_: encoding thousands of
        # texts can take longer than the training, and is cached across runs.
        self.encoding_time_ = time.perf_counter() - start
        self.query_dim_ = vectors.shape[1]
        self.device_ = resolve_device(self.device)

        seed = self._seed()
        previous_queries = None
        if previous is not None:
            previous_queries = (self.query_centroids_, self.query_radius_)
        self.query_centroids_, self.query_radius_ = _summarise_queries(
            vectors, seed, previous_queries
        )
        with (
            torch.random.fork_rng(devices=self._rng_devices()),
            interrupts_noticed() as interrupted,
        ):
            torch.manual_seed(seed)
            schedule = self._schedule(ragged)
            net = training_network(
                self.get_params(deep=False),
                ragged,
                vectors,
                seed=seed,
                schedule=schedule,
                device=self.device_,
            )
            draws = draws_per_model(ragged.n_sets, schedule[2])
            models = ModelSetDataset(np.arange(ragged.n_sets), draws)
            try:
                if previous is None:
                    # What fit does, with the set-up said: creating the optimiser
                    # imports much of torch the first time, seconds in all.
                    with status("Preparing the training", enabled=bool(self.verbose)):
                        net.initialize()
                    net.partial_fit(models, y=None)
                else:
                    net.initialize()
                    net.module_.load_state_dict(previous.module_.state_dict())
                    # partial_fit trains the network as it stands; fit would
                    # initialise it afresh.
                    net.partial_fit(models, y=None)
            except Exception as error:
                end_epoch_progress(net, error)
                raise
        if interrupted:
            # The user's Ctrl-C, which skorch took for a callback's stop. No partly
            # trained network is kept: a fine-tuned embedder stays as it was, one
            # trained afresh is left unfitted.
            if previous is None:
                vars(self).pop("net_", None)
            else:
                self.query_centroids_, self.query_radius_ = previous_queries
            raise KeyboardInterrupt
        self.net_ = net
        self.stop_reason_ = stop_reason(net)
        release_training_state(self.net_)
        self.validation_queries_ = None
        if previous is None:  # fine-tuning may have trained on any query
            self.validation_queries_ = self._unseen_queries(ragged, schedule, seed)
        # Inference never toggles the mode (that would race between threads that
        # share a fitted embedder); skorch sets the mode itself when it trains.
        self.net_.module_.eval()
        if previous is None:
            # Fine-tuning keeps the units of the first fit.
            self.embedding_scale_ = self._typical_distance(ragged, vectors, seed)
        return self

    def fit_transform(self, X, y=None):
        """Fit to the evaluation sets, then embed them.

        Parameters
        ----------
        X : sequence of mappings
            One mapping from query to score per model; a generator is read once.
        y : None
            Ignored.

        Returns
        -------
        ndarray of shape (n_models, embedding_dim)
        """
        X = reusable(X)
        return self.fit(X, y).transform(X)

    def _unseen_queries(self, ragged, schedule, seed):
        """Return the held-out validation queries no model trained on, or None.

        A model with no evaluation on a training query trains on all of its
        evaluations (:class:`~sklocus.nn.training.SetCollator`), so its queries
        are not unseen.
        """
        mask = validation_query_mask(
            len(ragged.queries), self.get_params(deep=False), schedule, seed
        )
        if mask is None:
            return None
        unseen = ~mask
        for model in range(ragged.n_sets):
            codes = ragged.set_codes(model)
            if not mask[codes].any():
                unseen[codes] = False
        return [_plain(ragged.queries[i]) for i in np.flatnonzero(unseen)]

    def _typical_distance(self, ragged, vectors, seed):
        """Median distance between the forward-pass embeddings of training models."""
        rng = np.random.default_rng((seed, 2))
        chosen = np.sort(
            rng.choice(ragged.n_sets, min(ragged.n_sets, _SCALE_MODELS), replace=False)
        )
        z = self._embed_raw(ragged.subset(chosen), vectors, refine=False)
        distances = pdist(z.astype(np.float64))
        median = float(np.median(distances)) if len(distances) else 0.0
        # A single training model, or all alike: nothing to measure, keep the units.
        return median if median > 0 and np.isfinite(median) else 1.0

    def _warm_start_network(self):
        """Return the fitted network to continue training, or None to start afresh."""
        if not (self.warm_start and hasattr(self, "net_")):
            return None
        fitted = self.net_.get_params()
        module = self.module or LocusNetwork
        if type(self.net_.module_) is not module:
            raise ValueError(
                f"warm_start=True continues training the fitted network, a "
                f"{type(self.net_.module_).__name__}; module={module.__name__} needs "
                "a new network: set warm_start=False to fit one from scratch"
            )
        for name in ARCHITECTURE:
            was = fitted[f"module__{name}"]
            if getattr(self, name) != was:
                raise ValueError(
                    f"warm_start=True continues training the fitted network, which "
                    f"has {name}={was}; {name}={getattr(self, name)} needs a new "
                    "network: set warm_start=False to fit one from scratch"
                )
        return self.net_

    def _seed(self):
        return int(
            check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        )

    def _rng_devices(self):
        return [torch.device(self.device_)] if self.device_.startswith("cuda") else []

    def _schedule(self, ragged):
        """Resolve "auto" by the pool's size (models and evaluations).

        Returns this fit's ``(validation_fraction, max_epochs, epoch_size)``; a
        fraction of 0 holds out no model, None means no validation.
        """
        n_sets = ragged.n_sets
        small = n_sets < _SMALL_POOL
        fraction, max_epochs, epoch_size = (
            self.validation_fraction,
            self.max_epochs,
            self.epoch_size,
        )
        if fraction == "auto":
            fraction = 0.0 if small and self.validation_queries > 0 else 0.1
        if fraction is not None and fraction > 0 and n_sets < 4:
            fraction = None
        if max_epochs == "auto":
            max_epochs = _SMALL_POOL_EPOCHS if small else _LARGE_POOL_EPOCHS
        if epoch_size == "auto":
            epoch_size = _SMALL_POOL_EPOCH_SIZE if small else _LARGE_POOL_EPOCH_SIZE
        return fraction, max_epochs, epoch_size

    def __setstate__(self, state):
        super().__setstate__(state)
        net = self.__dict__.get("net_")
        if net is not None:
            # skorch loads a network trained on a GPU onto the CPU where no GPU is
            # present (warning with a DeviceWarning); inference follows the network.
            self.device_ = str(net.device)

    @property
    def history_(self):
        """The skorch training history (one row per epoch)."""
        check_is_fitted(self, "net_")
        return self.net_.history

    @property
    def _n_features_out(self):
        # NotFittedError is an AttributeError: before fit the attribute is
        # missing, and get_feature_names_out says the embedder is not fitted.
        check_is_fitted(self, "net_")
        return self.embedding_dim

    # -- encoding queries -------------------------------------------------------

    def _encode(self, queries, fitted=True):
        """Encode queries as a float32 array, checking the encoder's output."""
        vectors = np.asarray(self.query_encoder_.transform(list(queries)))
        if vectors.ndim != 2 or vectors.shape[0] != len(queries):
            raise ValueError(
                f"the query encoder returned an array of shape {vectors.shape} for "
                f"{len(queries)} queries; expected (n_queries, dim)"
            )
        if fitted and vectors.shape[1] != self.query_dim_:
            raise ValueError(
                f"the query encoder gives {vectors.shape[1]}-d vectors but this "
                f"embedder was fitted on {self.query_dim_}-d ones; use the encoder it "
                "was fitted with"
            )
        if not np.isfinite(vectors).all():
            row = int(np.argmax(~np.isfinite(vectors).all(axis=1)))
            raise ValueError(f"the encoding of query {queries[row]!r} is not finite")
        return vectors.astype(np.float32, copy=False)

    # -- embedding ----------------------------------------------------------------

    def transform(self, X):
        """Embed each model with one forward pass over all its evaluations.

        Parameters
        ----------
        X : sequence of mappings
            One mapping from query to score per model. Queries need not have been
            seen in ``fit``.

        Returns
        -------
        ndarray of shape (n_models, embedding_dim), dtype float32
        """
        check_is_fitted(self, "net_")
        ragged = check_evaluation_sets(X)
        return self._embed(ragged, self._encode(ragged.queries))

    def _max_tokens(self):
        """Most (set x evaluation) tokens of an inference batch on this device."""
        return max_tokens(self.device_, self.embedding_dim)

    def _embed(self, ragged, vectors):
        """Embeddings as ``transform`` returns them (in units of embedding_scale_)."""
        z = self._embed_raw(ragged, vectors)
        return z / np.float32(self.embedding_scale_)

    def _embed_raw(self, ragged, vectors, refine=True):
        """Embeddings in the network's own units, refined if ``refine_steps``."""
        module = self.net_.module_
        refine = refine and self.refine_steps
        if refine:
            # Checked here: set_params on a fitted embedder skips fit's validation.
            _check_refinement(self.refine_steps, self.refine_penalty)
        # The status shows while neither step has lasted its own delay, so that
        # two short steps in a row leave no silence of two seconds.
        noun = "model" if ragged.n_sets == 1 else "models"
        with status(f"Embedding {ragged.n_sets:,} {noun}", enabled=bool(self.verbose)):
            with self._progress("Embedding models", ragged.n_sets) as progress:
                out = embed_sets(
                    module.encoder,
                    ragged,
                    vectors,
                    embedding_dim=self.embedding_dim,
                    device=self.device_,
                    precision=self.inference_precision,
                    progress=progress.advance,
                )
            if not refine:
                return out
            with self._progress("Refining embeddings", ragged.n_sets) as progress:
                refine_sets(
                    module.predictor,
                    ragged,
                    vectors,
                    out,
                    device=self.device_,
                    steps=self.refine_steps,
                    penalty=self.refine_penalty,
                    step_size=_REFINE_STEP_SIZE,
                    progress=progress.advance,
                )
        return out

    def _progress(self, label, n_models):
        """Report a step over ``n_models`` models if it lasts, and ``verbose`` is on."""
        return Progress(
            label, n_models, "model", delay=_PROGRESS_DELAY, enabled=bool(self.verbose)
        )

    def query_novelty(self, queries):
        """How far each query lies from the queries the embedder was trained on.

        The distance of a query's encoding to the nearest of ``query_centroids_``
        (k-means centres of the training queries' encodings), divided by
        ``query_radius_``, within which 95% of the training queries lie from
        their centre. Values above 1 are rarer than 1 in 20 among the training
        queries. When most of a user's queries exceed 1, the predictor reads them
        with terms learnt elsewhere: refine the embeddings (``refine_steps``) or
        fine-tune on the user's models (``warm_start``). On the Open LLM data,
        docs/research/transfer.md gives the share above 1 for new queries of the trained
        benchmarks and for a benchmark left out of training, and
        docs/user_guide/choosing-an-embedder.md what to do about it.

        Parameters
        ----------
        queries : sequence
            Queries understood by the query encoder.

        Returns
        -------
        ndarray of shape (n_queries,), dtype float32
        """
        check_is_fitted(self, "net_")
        if not hasattr(self, "query_centroids_"):
            raise ValueError(
                "this embedder was fitted by an sklocus that did not record its "
                "training queries' centres; refit it to use query_novelty"
            )
        vectors = self._encode(list(queries))
        distances = np.sqrt(
            np.maximum(
                (vectors**2).sum(axis=1)[:, None]
                - 2 * vectors @ self.query_centroids_.T
                + (self.query_centroids_**2).sum(axis=1)[None, :],
                0,
            )
        )
        return (distances.min(axis=1) / self.query_radius_).astype(np.float32)

    # -- prediction -------------------------------------------------------------

    def _check_embeddings(self, embeddings):
        return check_embeddings(embeddings, dim=self.embedding_dim, dtype=np.float32)

    def predict_correctness(self, embeddings, queries):
        """Probability that each model answers each query correctly.

        Parameters
        ----------
        embeddings : array-like of shape (n_models, embedding_dim)
            Output of ``transform``.
        queries : sequence of length n_queries
            Queries understood by the query encoder.

        Returns
        -------
        ndarray of shape (n_queries, n_models), dtype float32
            A row per query, as :meth:`LocusRouter.predict_correctness
            <sklocus.LocusRouter.predict_correctness>` and the ``scores`` of
            :mod:`sklocus.metrics` have them.
        """
        check_is_fitted(self, "net_")
        embeddings = self._check_embeddings(embeddings)
        queries = as_query_list(queries)
        if not queries:
            return np.empty((0, len(embeddings)), dtype=np.float32)
        vectors = self._encode(queries)
        return np.ascontiguousarray(self._predict(embeddings, vectors).T)

    def _predict(self, embeddings, vectors):
        return score_pairs(
            self.net_.module_.predictor,
            embeddings * np.float32(self.embedding_scale_),
            vectors,
            device=self.device_,
            precision=self.inference_precision,
        )

    def score(self, X, y=None):
        """Log-likelihood of a held-out part of each evaluation set.

        A fixed quarter of each set's evaluations (the same positions on every call)
        is held out; the rest builds the model's embedding, which then predicts the
        held-out scores. Sets of one evaluation are skipped. The score is
        :func:`~sklocus.metrics.correctness_log_likelihood` of those predictions, a
        proper scoring rule: ``GridSearchCV`` and ``cross_val_score`` with the
        default scoring prefer the embedder whose probabilities fit unseen
        evaluations best, where thresholded accuracy ties settings that differ only
        in calibration. :func:`sklocus.metrics.get_scorer` gives the Brier score,
        ROC AUC and accuracy of the same predictions, for ``scoring=``:
        scikit-learn's own strings (``scoring="roc_auc"``) need a ``y``, which an
        embedder does not take, and fail (:ref:`scoring_strings`).

        Parameters
        ----------
        X : sequence of mappings
            One mapping from query to score per model.
        y : None
            Ignored.

        Returns
        -------
        float
            Mean held-out log-likelihood per evaluation: at most 0, higher is better;
            ``log(0.5)``, about -0.693, is what predicting 0.5 everywhere earns.
        """
        return correctness_log_likelihood(*self._correctness_pairs(X))

    def _correctness_pairs(self, X, y=None):
        """Held-out scores of ``X`` and their predicted probabilities (flat arrays).

        What :meth:`score` and :func:`sklocus.metrics.get_scorer` measure: a fixed
        quarter of each set is held out and predicted from the embedding of the rest.
        """
        check_is_fitted(self, "net_")
        # The held-out quarter depends on the evaluations, not on their order.
        ragged = check_evaluation_sets(X).in_canonical_order()
        vectors = self._encode(ragged.queries)
        kept_codes, kept_scores, held_codes, held_scores = [], [], [], []
        for i in range(ragged.n_sets):
            codes, scores = ragged.set_codes(i), ragged.set_scores(i)
            if len(codes) < 2:
                continue
            n_held = max(1, int(round(_SCORE_HOLDOUT * len(codes))))
            order = np.random.default_rng(len(codes)).permutation(len(codes))
            held, kept = order[:n_held], order[n_held:]
            kept_codes.append(codes[kept])
            kept_scores.append(scores[kept])
            held_codes.append(codes[held])
            held_scores.append(scores[held])
        if not kept_codes:
            raise ValueError(
                "every evaluation set has a single evaluation; score needs sets of at "
                "least two to hold one out"
            )
        offsets = np.zeros(len(kept_codes) + 1, dtype=np.int64)
        np.cumsum([len(codes) for codes in kept_codes], out=offsets[1:])
        kept = RaggedEvaluations(
            queries=ragged.queries,
            query_codes=np.concatenate(kept_codes),
            scores=np.concatenate(kept_scores),
            offsets=offsets,
        )
        z = self._embed_raw(kept, vectors)
        probabilities = score_own_queries(
            self.net_.module_.predictor,
            z,
            held_codes,
            vectors,
            device=self.device_,
            precision=self.inference_precision,
        )
        return np.concatenate(held_scores), np.concatenate(probabilities)
