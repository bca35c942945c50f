"""simlib.course.checks: visible lesson checks and quick mode."""
import pytest

from simlib.course.checks import check, quick, sized


def test_check_prints_a_tick(capsys) -> None:
    check("two is more than one", 2 > 1, "2 vs 1")
    assert capsys.readouterr().out == "✓ two is more than one (2 vs 1)\n"


def test_failed_check_raises_with_the_claim() -> None:
    with pytest.raises(AssertionError, match="✗ one is more than two: 1 vs 2"):
        check("one is more than two", 1 > 2, "1 vs 2")
    with pytest.raises(ValueError, match="claim"):
        check("", True)


@pytest.mark.parametrize("value, expected", [("1", True), ("yes", True), ("0", False), ("", False), ("false", False)])
def test_quick_mode_follows_the_environment(monkeypatch, value, expected) -> None:
    monkeypatch.setenv("SIMLIB_QUICK", value)
    assert quick() is expected
    assert sized(100, 10) == (10 if expected else 100)


def test_quick_mode_is_off_without_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("SIMLIB_QUICK", raising=False)
    assert not quick()


def test_reveal_compares_a_guess_and_never_raises(capsys) -> None:
    from simlib.course.checks import reveal

    reveal("How many?", None, 4, detail="it took 12.5 s")
    asked = capsys.readouterr().out
    assert "set my_guess" in asked and "4" not in asked and "12.5" not in asked  # no guess: no answer, no detail
    reveal("How many?", 3, 4, tolerance=1)
    assert capsys.readouterr().out.rstrip().endswith("✓ right.")
    reveal("How many?", 2, 4)
    assert "✗ not quite" in capsys.readouterr().out
    reveal("Which?", "PS", "PS")
    assert "✓ right" in capsys.readouterr().out
    reveal("Within 1%?", True, False, detail="the gap was 1.4%")
    assert "✗ not quite" in (out := capsys.readouterr().out) and out.rstrip().endswith("the gap was 1.4%")
    reveal("Within 1%?", 1, True)  # True is not the number 1: a yes/no answer wants True or False
    assert "✗ not quite" in capsys.readouterr().out
