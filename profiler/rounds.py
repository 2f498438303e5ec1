"""Rounds of disjoint rank pairs that together cover every pair once (a round-robin tournament).

The circle method: fix one rank, rotate the others; with an odd count a phantom rank sits out
one rank per round. n - 1 rounds for even n, n for odd n; every round loads the fabric the way a
real job does, all pairs at once.
"""


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of (a, b) pairs with a < b; every unordered pair of range(n) appears exactly once."""
    if n < 2:
        return []
    ranks: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    size = len(ranks)
    rounds = []
    for _ in range(size - 1):
        pairs = []
        for i in range(size // 2):
            a, b = ranks[i], ranks[size - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return rounds
