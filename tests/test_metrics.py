import pytest

from spec_engine.metrics import expected_tokens_per_round


@pytest.mark.parametrize("a,k,expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 1, 1.5), (0.5, 2, 1.75), (0.8, 4, 3.3616)])
def test_expected_tokens_per_round(a, k, expected):
    assert expected_tokens_per_round(a, k) == pytest.approx(expected)
