"""A small generated English-like corpus for the quick start and the tests.

Generated rather than shipped, so the repository carries no data and every machine produces
the same bytes: simple sentences from a fixed grammar plus small arithmetic facts, which a tiny
GPT learns visibly within a few hundred steps. ``random.Random(seed)`` is specified to produce
the same stream on every Python version for the calls used here (``randrange``, ``choice``).
"""

import random

# Word lists: space-separated, or comma-separated where an entry has spaces.
_WORDS = {
    "names": "Ada Alan Grace Edsger Barbara Donald Frances John Margaret Dennis Ken Radia "
    "Leslie Tony Niklaus Sophie",
    "animals": "cat dog fox owl horse rabbit sparrow otter badger crow",
    "places": "the river,the old mill,the market,the hill,the library,the harbour,the forest,"
    "the station,the garden,the bridge",
    "verbs": "walked to,looked at,painted,visited,remembered,sang about,found,left,cleaned,"
    "measured",
    "adjectives": "quiet bright small tall careful green patient quick heavy curious",
    "numbers": "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen",
}
_NAMES, _ANIMALS, _ADJECTIVES, _NUMBERS = (
    _WORDS[k].split() for k in ("names", "animals", "adjectives", "numbers")
)
_PLACES, _VERBS = (_WORDS[k].split(",") for k in ("places", "verbs"))


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return (
            f"{rng.choice(_NAMES)} {rng.choice(_VERBS)} {rng.choice(_PLACES)} with a "
            f"{rng.choice(_ADJECTIVES)} {rng.choice(_ANIMALS)}."
        )
    if kind == 1:
        a, b = rng.randrange(10), rng.randrange(10)
        return f"{_NUMBERS[a].capitalize()} plus {_NUMBERS[b]} is {_NUMBERS[a + b]}."
    if kind == 2:
        animal = rng.choice(_ANIMALS)
        adjective, place = rng.choice(_ADJECTIVES), rng.choice(_PLACES)
        return f"The {animal} is {adjective}, and the {animal} likes {place}."
    place, count = rng.choice(_PLACES), _NUMBERS[rng.randrange(2, 10)]
    return f"In {place} there were {count} {rng.choice(_ANIMALS)}s."


def generate(num_docs: int = 2000, seed: int = 0) -> list[str]:
    """``num_docs`` short paragraphs, the same for the same ``seed`` on every machine."""
    rng = random.Random(seed)
    return [" ".join(_sentence(rng) for _ in range(rng.randrange(3, 9))) for _ in range(num_docs)]
