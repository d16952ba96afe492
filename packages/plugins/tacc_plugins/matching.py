"""Minimum-cost assignment of rows to columns (rows <= columns): the Hungarian method with
shortest augmenting paths and potentials, O(rows^2 x columns).

Written here rather than taken from scipy (`scipy.optimize.linear_sum_assignment`, the
well-kept answer): the plug-ins run inside the agent on every node, and numpy + scipy
(~100 MB) for a matrix of at most a few dozen rows by a few hundred columns, solved a few
times a minute, would be most of the agent's size. tests/unit/plugins/test_allox.py checks it
against every permutation of small matrices."""

from __future__ import annotations

from collections.abc import Sequence

INFEASIBLE = 1e12  # a cost standing for "never": larger than any real sum, still finite


def min_cost_assignment(cost: Sequence[Sequence[float]]) -> list[int]:
    """The column given to each row, so that no column is given twice and the sum of
    the chosen costs is the least possible."""
    rows = len(cost)
    columns = len(cost[0]) if rows else 0
    if rows > columns:
        raise ValueError(f"{rows} rows cannot each get one of {columns} columns")
    # 1-based, column 0 a sentinel: row_potential[i], column_potential[j], owner[j] (the
    # row holding column j, 0 for none), back[j] (the column before j on the path).
    row_potential = [0.0] * (rows + 1)
    column_potential = [0.0] * (columns + 1)
    owner = [0] * (columns + 1)
    back = [0] * (columns + 1)
    for row in range(1, rows + 1):
        owner[0] = row
        column = 0
        slack = [float("inf")] * (columns + 1)
        visited = [False] * (columns + 1)
        while owner[column] != 0:
            visited[column] = True
            current = owner[column]
            costs = cost[current - 1]
            delta, nearest = float("inf"), 0
            for j in range(1, columns + 1):
                if visited[j]:
                    continue
                reduced = costs[j - 1] - row_potential[current] - column_potential[j]
                if reduced < slack[j]:
                    slack[j], back[j] = reduced, column
                if slack[j] < delta:
                    delta, nearest = slack[j], j
            for j in range(columns + 1):
                if visited[j]:
                    row_potential[owner[j]] += delta
                    column_potential[j] -= delta
                else:
                    slack[j] -= delta
            column = nearest
        while column:  # flip the augmenting path
            previous = back[column]
            owner[column] = owner[previous]
            column = previous
    given = [-1] * rows
    for j in range(1, columns + 1):
        if owner[j]:
            given[owner[j] - 1] = j - 1
    return given
