"""hvdcls.maths.lars_lamb: the rules and the NumPy reference the backends' optimizers are tested
against (tests/cases/optimizers.py), checked here by hand."""
import numpy as np
import pytest

from hvdcls.maths import lars_lamb


def test_only_parameters_of_two_or_more_dimensions_are_adapted():
    assert [lars_lamb.adapted(n) for n in (0, 1, 2, 4)] == [False, False, True, True]


@pytest.mark.parametrize("w, u, want", [(5.0, 1.0, 0.1), (0.0, 1.0, 1.0), (5.0, 0.0, 1.0), (0.0, 0.0, 1.0)])
def test_the_trust_ratio_is_one_when_either_norm_is_zero(w, u, want):
    assert lars_lamb.trust_ratio(w, u, 0.02) == pytest.approx(want)


def test_the_lars_reference_by_hand():
    """Step 1: ratio eta ||w|| / ||g + b w|| = 0.02 x 5 / 1; step 2 adds momentum x velocity."""
    state = lars_lamb.ReferenceState()
    w = np.array([[3.0, 0.0], [0.0, 4.0]])
    g = np.array([[0.3, 0.0], [0.0, 0.4]])  # g + 0.1 w = [[.6, 0], [0, .8]], norm 1
    w1 = lars_lamb.lars_step(w, g, state, lr=0.5, momentum=0.9, weight_decay=0.1, coefficient=0.02)
    np.testing.assert_allclose(w1, [[2.97, 0.0], [0.0, 3.96]])
    w2 = lars_lamb.lars_step(w1, np.zeros((2, 2)), state, 0.5, 0.9, 0.1, 0.02)
    ratio = 0.02 / 0.1  # g = 0: u = b w, so ||w|| / ||u|| = 1 / b
    np.testing.assert_allclose(w2, w1 - (0.9 * (w - w1) + 0.5 * ratio * 0.1 * w1))
    assert state.ratios == pytest.approx([0.1, ratio])
    bias = lars_lamb.ReferenceState()
    b1 = lars_lamb.lars_step(np.array([1.0, -2.0]), np.array([0.5, 0.5]), bias, 0.5, 0.9, 0.1, 0.02)
    np.testing.assert_allclose(b1, [0.75, -2.25])  # plain SGD step, no decay, ratio 1
    assert bias.ratios == [1.0]


def test_the_lamb_reference_by_hand():
    """Step 1 with bias correction: r = g / (|g| + eps) ~ sign(g); u = r + b w."""
    state = lars_lamb.ReferenceState()
    w, g = np.array([[3.0, 0.0], [0.0, 4.0]]), np.array([[2.0, 0.0], [0.0, -1.0]])
    w1 = lars_lamb.lamb_step(w, g, state, lr=0.1, weight_decay=0.5)
    u = np.array([[1.0 + 1.5, 0.0], [0.0, -1.0 + 2.0]])  # [[2.5, 0], [0, 1]]
    ratio = 5.0 / np.sqrt(2.5 ** 2 + 1.0)
    np.testing.assert_allclose(w1, w - 0.1 * ratio * u, rtol=1e-5)
    assert state.step == 1 and state.ratios == pytest.approx([ratio], rel=1e-5)
    zero = lars_lamb.ReferenceState()
    z1 = lars_lamb.lamb_step(np.zeros((2, 2)), g, zero, 0.1, 0.5)
    np.testing.assert_allclose(z1, -0.1 * np.sign(g), rtol=1e-5)  # ||w|| = 0: ratio 1
    assert zero.ratios == [1.0]
