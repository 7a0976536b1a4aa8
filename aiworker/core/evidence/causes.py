"""Why a repair episode is asked for: what failed, as the findings it hands the repair
say.

review: REQUEST_CHANGES; ci: a failing ./ci/run; conflict: the moved base does not merge;
base_checks: it merges, but the checks fail on the merge; checks: a plan's combined
checks fail once every milestone is in; scope: the issue changed after the work was done.
"""

CAUSES = ("review", "ci", "conflict", "base_checks", "checks", "scope")
