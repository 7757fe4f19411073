"""The CUDA path, end to end. Runs where torch sees a GPU; skipped elsewhere (CI).

A GPU-trained estimator must give, on the GPU, what the same network gives on a
CPU, and must load and serve on a machine with no GPU.
"""

import copy
import os
import subprocess
import sys
import textwrap

import joblib
import numpy as np
import pytest
import torch

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"
)

SMALL = dict(
    embedding_dim=32,
    n_latents=8,
    n_layers=1,
    n_heads=2,
    predictor_hidden=32,
    max_epochs=3,
    epoch_size=64,
    batch_size=8,
    validation_fraction=None,
    random_state=0,
)

# LocusNetwork's arguments at the SMALL sizes, for networks built directly.
SMALL_MODULE = dict(
    embedding_dim=32, n_latents=8, n_layers=1, n_heads=2, predictor_hidden=32
)


@pytest.fixture(scope="module")
def data():
    return make_evaluations(
        n_models=40,
        n_queries=400,
        evals_per_model=(100, 300),
        query_dim=32,
        random_state=0,
    )


@pytest.fixture(scope="module")
def gpu(data):
    return LocusEmbedder(query_encoder=data.encoder, device="cuda", **SMALL).fit(
        data.evaluation_sets
    )


def _on_a_cpu_machine(script):
    """Run ``script`` in a fresh process that sees no GPU."""
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, "-c", script], check=True, env=environment)


def test_it_trains_and_infers_on_the_gpu(gpu, data):
    assert gpu.device_ == "cuda"
    assert next(gpu.net_.module_.parameters()).is_cuda
    z = gpu.transform(data.evaluation_sets)
    assert z.shape == (40, 32) and z.dtype == np.float32 and np.isfinite(z).all()
    p = gpu.predict_correctness(z, data.query_ids[:50])
    assert ((p >= 0) & (p <= 1)).all()
    assert np.log(0.5) < gpu.score(data.evaluation_sets) < 0.0


def test_auto_picks_the_gpu(data):
    embedder = LocusEmbedder(
        query_encoder=data.encoder, **{**SMALL, "max_epochs": 1}
    ).fit(data.evaluation_sets[:8])
    assert embedder.device_ == "cuda"


def test_the_same_network_gives_the_same_results_on_a_cpu_machine(gpu, data, tmp_path):
    path = tmp_path / "embedder.joblib"
    joblib.dump(gpu, path)
    sets, queries = data.evaluation_sets, data.query_ids[:50]
    z = gpu.transform(sets)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "p.npy", gpu.predict_correctness(z, queries))
    # Refinement on the GPU, with Adam as one fused kernel.
    refined = copy.deepcopy(gpu).set_params(refine_steps=20).transform(sets)
    np.save(tmp_path / "refined.npy", refined)
    _on_a_cpu_machine(
        textwrap.dedent(
            f"""
            import warnings
            import joblib, numpy as np, torch
            from sklocus.datasets import make_evaluations
            assert not torch.cuda.is_available()
            data = make_evaluations(n_models=40, n_queries=400,
                                    evals_per_model=(100, 300), query_dim=32,
                                    random_state=0)
            with warnings.catch_warnings(record=True):
                embedder = joblib.load({str(path)!r})
            assert embedder.device_ == "cpu", embedder.device_
            z = embedder.transform(data.evaluation_sets)
            z_gpu = np.load({str(tmp_path / "z.npy")!r})
            relative = np.linalg.norm(z - z_gpu, axis=1) / np.linalg.norm(z, axis=1)
            print("largest relative embedding change, GPU vs CPU:", relative.max())
            assert relative.max() < 1e-4, relative.max()
            p = embedder.predict_correctness(z, data.query_ids[:50])
            gap = np.abs(p - np.load({str(tmp_path / "p.npy")!r})).max()
            print("largest probability change, GPU vs CPU:", gap)
            assert gap < 1e-4, gap
            refined = embedder.set_params(refine_steps=20).transform(
                data.evaluation_sets
            )
            on_gpu = np.load({str(tmp_path / "refined.npy")!r})
            relative = np.linalg.norm(refined - on_gpu, axis=1) / np.linalg.norm(
                refined, axis=1
            )
            print("largest relative refined-embedding change, GPU vs CPU:",
                  relative.max())
            assert relative.max() < 1e-3, relative.max()
            """
        )
    )


def test_the_optimisers_are_fused_on_the_gpu_only(monkeypatch):
    from sklocus.nn.assembly import locus_network
    from sklocus.nn.refinement import refine_embeddings

    sizes = dict(SMALL_MODULE, query_dim=8)
    assert locus_network(sizes, "cuda").initialize().optimizer_.defaults["fused"]
    assert not locus_network(sizes, "cpu").initialize().optimizer_.defaults["fused"]
    made = []
    original = torch.optim.Adam

    class Recording(original):
        def __init__(self, *args, **kwargs):
            made.append(kwargs.get("fused"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "Adam", Recording)
    for device in ("cuda", "cpu"):
        network = locus_network(sizes, device).initialize().module_
        z = torch.zeros(2, SMALL_MODULE["embedding_dim"], device=device)
        projected = network.predictor.project_query(torch.zeros(3, 8, device=device))
        refine_embeddings(
            network.predictor,
            z,
            projected,
            torch.zeros(2, 3, dtype=torch.long, device=device),
            torch.ones(2, 3, device=device),
            None,
            steps=2,
            penalty=1.0,
            step_size=0.01,
        )
    assert made == [True, None]


def test_training_on_the_gpu_is_repeatable(gpu, data):
    again = LocusEmbedder(query_encoder=data.encoder, device="cuda", **SMALL).fit(
        data.evaluation_sets
    )
    z, z_again = (
        gpu.transform(data.evaluation_sets),
        again.transform(data.evaluation_sets),
    )
    relative = np.linalg.norm(z - z_again, axis=1) / np.linalg.norm(z, axis=1)
    print("largest relative embedding change between two GPU fits:", relative.max())
    # Index backward passes accumulate with atomics on a GPU, so two fits may
    # differ in the last bits; they must not differ in substance.
    assert relative.max() < 1e-2, relative.max()


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_16_bit_inference_on_the_gpu_stays_close_to_float32(gpu, data, precision):
    import copy

    low = copy.deepcopy(gpu).set_params(inference_precision=precision)
    sets, queries = data.evaluation_sets, data.query_ids[:50]
    z, z_low = gpu.transform(sets), low.transform(sets)
    assert z_low.dtype == np.float32 and not np.array_equal(z_low, z)
    relative = np.linalg.norm(z_low - z, axis=1) / np.linalg.norm(z, axis=1)
    print(f"{precision}: largest relative embedding change", relative.max())
    assert relative.max() < 0.05, relative.max()
    gap = np.abs(
        low.predict_correctness(z, queries) - gpu.predict_correctness(z, queries)
    ).max()
    assert gap < 0.02, gap


def test_a_gpu_router_serves_on_a_cpu_machine(data, tmp_path):
    queries = list(data.query_ids)
    scores, _ = to_matrix(data.evaluation_sets, queries=queries)
    train, test = queries[:300], queries[300:]
    embedder = LocusEmbedder(query_encoder=data.encoder, device="cuda", **SMALL)
    router = LocusRouter(embedder).fit(train, scores[:300])
    expected = router.predict(test)
    path = tmp_path / "router.joblib"
    joblib.dump(router, path)
    np.save(tmp_path / "expected.npy", expected)
    _on_a_cpu_machine(
        textwrap.dedent(
            f"""
            import warnings
            import joblib, numpy as np
            with warnings.catch_warnings(record=True):
                router = joblib.load({str(path)!r})
            chosen = router.predict({test!r})
            expected = np.load({str(tmp_path / "expected.npy")!r})
            print("routing agreement, GPU vs CPU:", (chosen == expected).mean())
            assert (chosen == expected).mean() >= 0.99
            """
        )
    )
