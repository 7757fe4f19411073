"""How close two computations of the same embeddings, or probabilities, must be.

A set's vector does not depend on the other sets embedded with it beyond float32
rounding. The rounding itself may: a set padded alike sits at another place of
a batch's tensors among other sets than alone, and where that place falls
relative to the CPU's vector width or the BLAS kernel's blocks of rows (which
differ between an Intel and an AMD processor, and with the number of threads),
an elementwise function or a matrix product rounds it in another last bit.
Refinement's Adam steps carry such a bit into the next steps. So the tests
compare vectors of one input computed in different company (streaming, Dask,
onboarding one model among others) within a tolerance relative to the vectors'
scale, and assert bit-identity only where the arithmetic guarantees it: the same
input in the same batches, in one process or after a reload. A model's
probabilities likewise depend on the other models and queries scored with it
beyond rounding only where the batching differs: the predictor stacks a pool's
models into one matrix product (``CorrectnessPredictor.pairwise_projected``) and
projects the queries of a call together, so a model scored in another pool or a
query in another chunk can round otherwise.
"""

import numpy as np

# float32 resolves 6e-8 of a value. On an AMD EPYC (Zen 4, MKL, AVX-512 ATen)
# vectors refined in other company differed by up to 2.8e-7 of their row's
# largest coordinate (10 and 50 steps, about 2 units in the last place); seven
# times that bounds the rounding without admitting a real change of the vector.
BATCH_RTOL = 2e-6


def assert_same_vectors(actual, expected, rtol=BATCH_RTOL, err_msg=""):
    """Assert two arrays of vectors agree within float32 rounding of their scale.

    Parameters
    ----------
    actual, expected : array-like of shape (..., dim)
        Vectors of the same inputs, computed in different batches.
    rtol : float, default=BATCH_RTOL
        Largest difference of a coordinate, relative to the largest absolute
        coordinate of its vector in ``expected``.
    err_msg : str, default=""
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape, err_msg)
    scale = np.abs(expected).max(axis=-1, keepdims=True)
    gap = np.abs(actual - expected)
    worst = float((gap / np.maximum(scale, np.finfo(np.float32).tiny)).max(initial=0))
    assert np.all(gap <= rtol * scale), (
        f"vectors differ by {worst:.3g} of their scale, beyond {rtol:g} {err_msg}"
    )


# A probability's scale is 1, so the tolerance is absolute. float32 resolves 6e-8
# of it. On an AMD EPYC (MKL, one thread) a model's probability of a query
# scored in other company (one model at a time, one more model in the pool,
# chunks of 7 queries) differed by up to 1.2e-7, and float32 from float64 by up
# to 1.0e-7 (test_router's pool refined 50 steps, logits up to 5.5). Eight times
# that bounds the rounding; routing counts utilities this close as tied
# (sklocus._routing.TIE_TOLERANCE).
PROBABILITY_ATOL = 1e-6


def assert_same_probabilities(actual, expected, atol=PROBABILITY_ATOL, err_msg=""):
    """Assert two arrays of probabilities agree within float32 rounding.

    Parameters
    ----------
    actual, expected : array-like of probabilities
        Of the same models and queries, computed in different batches.
    atol : float, default=PROBABILITY_ATOL
        Largest difference of a probability.
    err_msg : str, default=""
    """
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol, err_msg=err_msg)
