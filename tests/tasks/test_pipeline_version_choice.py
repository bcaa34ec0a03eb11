"""Which pipeline runs a task of a given version (Pipeline.for_version), and a saga's plan is its version's."""

import pytest

from tools_app.toolkit.pipelines import Pipeline, Step, StepContext


def noop(ctx: StepContext) -> None:
    return None


def undo_v1(ctx: StepContext) -> None:
    return None


def undo_v2(ctx: StepContext) -> None:
    return None


V1 = Pipeline(steps=(Step("charge", noop, compensate=undo_v1), Step("ship", noop)))
V2 = Pipeline(steps=(Step("charge", noop, compensate=undo_v2), Step("notify", noop, compensate=undo_v2),
                     Step("ship", noop)), version=3, also_runs=(2,), previous=(V1,))


def test_a_task_runs_on_its_own_versions_pipeline_or_on_none():
    assert V2.for_version(3) is V2 and V2.for_version(2) is V2  # current, and through patch markers
    assert V2.for_version(1) is V1  # kept whole
    assert V2.for_version(None) is V2
    assert Pipeline(steps=V2.steps, version=3).for_version(1) is None  # dropped: start-up refuses
    assert V2.versions() == (3, 2, 1)


def test_a_sagas_compensation_plan_is_the_one_its_task_started_with():
    # step "ship" fails for good on a version-1 task: only v1's compensation runs
    plan = V2.for_version(1).plan(1)
    assert [step.name for step in plan] == ["charge", "failed:ship", "compensate:charge"]
    assert plan[-1].run is undo_v1
    assert [step.name for step in V2.plan(2)] == ["charge", "notify", "failed:ship", "compensate:notify",
                                                  "compensate:charge"]


@pytest.mark.parametrize("options", [{"version": 0}, {"version": 2, "also_runs": (2,)},
                                     {"version": 2, "also_runs": (3,)}, {"version": 1, "previous": (V1,)}])
def test_a_version_declared_twice_or_not_older_is_refused(options):
    with pytest.raises(ValueError):
        Pipeline(steps=V1.steps, **options)
