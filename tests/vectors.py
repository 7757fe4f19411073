"""How close two computations of the same embeddings must be.

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
input in the same batches, in one process or after a reload.
"""

import numpy as np

# float32 resolves 6e-8 of a value. On an AMD EPYC (Zen 4, MKL, AVX-512 ATen)
# vectors refined in other company differed by up to 2.4e-7 of their row's
# largest coordinate (10 and 50 steps, about 2 units in the last place); eight
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
