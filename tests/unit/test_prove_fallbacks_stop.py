"""prove's fallback step cuts its stop string from a drafted text: the one that first occurs latest."""
import pytest

from rig.core import RigError
from rig.serving.prove_fallbacks import stop_string


def test_the_stop_string_is_the_one_that_first_occurs_latest_in_a_repeating_text():
    text = "4550514849464752" * 4  # run 14's logprobs text: a period of 16 characters
    stop = stop_string(text)
    # "245", across the first period's end: every later start repeats one within the first period
    assert len(stop) == 3 and text.find(stop) == 15
    assert stop_string("abcdefgh") == "fgh"


@pytest.mark.parametrize("text", ["", "ab", "aaaaaaaa"])
def test_a_text_too_short_or_one_character_repeated_gives_no_stop_string(text):
    with pytest.raises(RigError, match="no stop string can be cut"):
        stop_string(text)
