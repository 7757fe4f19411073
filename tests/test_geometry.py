import numpy as np
import pytest

from sklocus.geometry import model_distances, nearest_models


def test_model_distances_cosine_and_euclidean():
    embeddings = np.array([[1.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    cosine = model_distances(embeddings)
    np.testing.assert_allclose(cosine, [[0, 1, 0], [1, 0, 1], [0, 1, 0]], atol=1e-12)
    euclidean = model_distances(embeddings, embeddings[:1], metric="euclidean")
    np.testing.assert_allclose(euclidean.ravel(), [0, np.sqrt(5), 1])


def test_nearest_models_excludes_self_and_sorts():
    embeddings = np.array([[0.0], [1.0], [3.0], [3.5]])
    indices, distances = nearest_models(embeddings, k=2, metric="euclidean")
    assert indices.tolist() == [[1, 2], [0, 2], [3, 1], [2, 1]]
    np.testing.assert_allclose(distances, [[1, 3], [1, 2], [0.5, 2], [0.5, 2.5]])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: nearest_models(np.zeros((3, 2)), k=3),
            "k=3 neighbours asked for, but only 3 models",
        ),
        (
            lambda: nearest_models(np.zeros((3, 2)), k=0),
            "k=0 must be a positive integer",
        ),
        (lambda: model_distances(np.zeros(3)), "must be a 2-D array"),
        (lambda: model_distances([[0.0], [np.nan]]), "embeddings row 1 is not finite"),
        (
            lambda: model_distances(np.ones((2, 2)), metric="manhattan"),
            "metric='manhattan' is not one of",
        ),
        (
            lambda: model_distances(np.ones((2, 2)), np.ones((2, 3))),
            "other has width 3",
        ),
    ],
)
def test_geometry_errors_name_the_problem(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        call()
