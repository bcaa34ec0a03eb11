"""API 1.2's declarations: models read from the handler's annotations, the 1.1 spelling still runs (deprecated);
API 2.1's reconcilers, given a SentCall of the input model, and long tools' grouped retention."""

from __future__ import annotations

from datetime import timedelta

import pytest

from idemops.tools import (
    ApprovalPolicy,
    ExpiryPolicy,
    Found,
    KeepFor,
    Pipeline,
    Reconciliation,
    Retention,
    SentCall,
    Step,
    StepContext,
    StrictModel,
    Tenant,
    ToolContext,
    WriteInput,
    long_tool,
    read_tool,
    write_tool,
)
from tools_app.engine.models import IdempotencyRecord
from tools_app.toolkit.registry import _TOOLS, get_tool, sent_call


class NoteInput(WriteInput):
    text: str


class OtherInput(WriteInput):
    text: str


class Noted(StrictModel):
    text: str


@pytest.fixture
def forget():
    names: list[str] = []
    yield names
    for name in names:
        _TOOLS.pop(name, None)


def found(record) -> Found:
    return Found({"text": "x"})


def test_the_new_declaration_reads_its_models_from_the_handler_and_warns_of_nothing(forget, recwarn):
    forget += ["note_new", "read_new"]

    @write_tool(name="note_new", title="Note", personal_fields=frozenset({"text"}),
                reconciliation=Reconciliation(found, retry_window=timedelta(minutes=5)),
                retention=Retention(key=timedelta(hours=2), on_expiry=ExpiryPolicy.HOLD,
                                    keep=KeepFor(records=timedelta(days=3))))
    def note_new(ctx: ToolContext, args: NoteInput) -> Noted:
        return Noted(text=args.text)

    @read_tool(name="read_new", title="Read", personal_fields=frozenset())
    def read_new(ctx: ToolContext, args: NoteInput) -> Noted:
        return Noted(text=args.text)

    spec = get_tool("note_new")
    assert (spec.input_model, spec.output_model) == (NoteInput, Noted)
    assert (spec.transactional, spec.reconciler, spec.retry_window) == (False, found, timedelta(minutes=5))
    assert (spec.retention, spec.on_expiry, spec.keep) == (timedelta(hours=2), ExpiryPolicy.HOLD,
                                                          KeepFor(records=timedelta(days=3)))
    assert (get_tool("read_new").input_model, get_tool("read_new").output_model) == (NoteInput, Noted)
    assert [w for w in recwarn if issubclass(w.category, DeprecationWarning)] == []


def test_the_old_spelling_still_runs_with_a_deprecation_warning(forget):
    forget.append("note_old")
    with pytest.warns(DeprecationWarning) as warned:
        @write_tool(name="note_old", title="Note", input_model=NoteInput, output_model=Noted,
                    personal_fields=frozenset({"text"}), transactional=False, reconciler=found,
                    retry_window=timedelta(minutes=5), retention=timedelta(hours=2), on_expiry=ExpiryPolicy.HOLD,
                    keep=KeepFor(records=timedelta(days=3)))
        def note_old(ctx: ToolContext, args: NoteInput) -> Noted:
            return Noted(text=args.text)
    said = " ".join(str(w.message) for w in warned)
    assert "input_model=" in said and "output_model=" in said and "Reconciliation" in said and "Retention" in said
    # declared as the new spelling would have been, and its handler runs
    spec = get_tool("note_old")
    assert (spec.input_model, spec.output_model, spec.transactional, spec.reconciler) == (NoteInput, Noted, False,
                                                                                        found)
    assert (spec.retention, spec.on_expiry, spec.keep) == (timedelta(hours=2), ExpiryPolicy.HOLD,
                                                          KeepFor(records=timedelta(days=3)))
    args = NoteInput(text="hi", idempotency_key="k-1", trace_id=None)
    assert spec.handler(ToolContext(tenant_id=1, actor="agent:t/a"), args) == Noted(text="hi")


def test_a_named_model_that_differs_from_the_annotation_is_refused_at_declaration(forget):
    forget.append("note_mismatch")
    with pytest.raises(TypeError, match=r"input_model=OtherInput differs from the handler's annotation NoteInput"), \
            pytest.warns(DeprecationWarning):
        @write_tool(name="note_mismatch", title="Note", input_model=OtherInput, personal_fields=frozenset())
        def note_mismatch(ctx: ToolContext, args: NoteInput) -> Noted:
            return Noted(text=args.text)
    assert "note_mismatch" not in _TOOLS


def test_a_handler_without_model_annotations_is_refused_naming_what_to_annotate(forget):
    forget.append("note_bare")
    with pytest.raises(TypeError, match=r"annotate the handler's args parameter with a pydantic model"):
        @write_tool(name="note_bare", title="Note", personal_fields=frozenset())
        def note_bare(ctx, args) -> Noted:
            return Noted(text=args.text)
    assert "note_bare" not in _TOOLS


def test_a_reconciler_reads_the_calls_input_as_its_model_and_one_given_the_record_is_deprecated(forget, recwarn):
    """API 2.1: a reconciler is given a SentCall of the tool's input model; one annotated for the record still
    runs (the record's attributes read through the SentCall), with a DeprecationWarning at declaration."""
    forget += ["note_sent", "note_record"]

    def typed(call: SentCall[NoteInput]) -> Found:
        return Found({"text": call.args.text, "sent": call.downstream_key})

    @write_tool(name="note_sent", title="Note", personal_fields=frozenset({"text"}),
                reconciliation=Reconciliation(typed))
    def note_sent(ctx: ToolContext, args: NoteInput) -> Noted:
        return Noted(text=args.text)

    assert [w for w in recwarn if issubclass(w.category, DeprecationWarning)] == []

    def old(record: IdempotencyRecord) -> Found:
        return Found({"text": record.arguments["text"], "sent": record.downstream_key, "at": record.operation_id})

    with pytest.warns(DeprecationWarning, match=r"given the idempotency record is deprecated \(API_VERSION 2.1\)"):
        @write_tool(name="note_record", title="Note", personal_fields=frozenset({"text"}),
                    reconciliation=Reconciliation(old))
        def note_record(ctx: ToolContext, args: NoteInput) -> Noted:
            return Noted(text=args.text)

    # what the engine gives either (reconciliation.reconcile: registry.sent_call), over a record as read
    record = IdempotencyRecord(tool="note_sent", key="note-1", tenant_id=1, downstream_key="io-1",
                               operation_id="00000000-0000-0000-0000-000000000001",
                               arguments={"text": "hi", "trace_id": None})
    call = sent_call(record, get_tool("note_sent"))
    assert (call.args, call.key, call.tenant_id, call.record) == (
        NoteInput(text="hi", idempotency_key="note-1", trace_id=None), "note-1", 1, record)
    assert get_tool("note_sent").reconciler(call) == Found({"text": "hi", "sent": "io-1"})
    assert get_tool("note_record").reconciler(sent_call(record, get_tool("note_record"))) == Found(
        {"text": "hi", "sent": "io-1", "at": "00000000-0000-0000-0000-000000000001"})
    # arguments that no longer make the input model say so, rather than hand the reconciler half a call
    broken = sent_call(IdempotencyRecord(key="note-2", arguments={"words": "hi"}), get_tool("note_sent"))
    with pytest.raises(ValueError, match=r"do not rebuild NoteInput"):
        assert broken.args is None  # never reached: reading it raises


def a_step(ctx: StepContext[NoteInput]) -> dict:
    return {"text": ctx.arguments.text}


def approve_notes(tenant: Tenant, args: NoteInput) -> ApprovalPolicy | None:
    return ApprovalPolicy(summary=f"Note of {len(args.text)} characters") if len(args.text) > 100 else None


def test_a_long_tool_groups_its_retention_and_the_flat_keywords_still_run_with_a_warning(forget, recwarn):
    """API 2.1: `long_tool(retention=Retention(...))` as write_tool; its approval rule and operation_arguments read
    its input model."""
    forget += ["long_new", "long_old", "long_both", "long_default"]
    pipeline = Pipeline(steps=(Step("note", a_step),))
    spec = long_tool(name="long_new", title="Long", description="Long.", input_model=NoteInput, output_model=Noted,
                     pipeline=pipeline, personal_fields=frozenset({"text"}), approval=approve_notes,
                     operation_arguments=lambda args, version: {"text": args.text.lower()},
                     retention=Retention(key=timedelta(hours=2), on_expiry=ExpiryPolicy.HOLD,
                                         keep=KeepFor(tasks=timedelta(days=3))))
    assert [w for w in recwarn if issubclass(w.category, DeprecationWarning)] == []
    assert (spec.retention, spec.on_expiry, spec.keep) == (timedelta(hours=2), ExpiryPolicy.HOLD,
                                                          KeepFor(tasks=timedelta(days=3)))
    assert spec.approval is approve_notes and spec.pipeline is pipeline and spec.writes
    assert spec.business_arguments(NoteInput(text="HI", idempotency_key="k-1")) == {"text": "hi"}

    with pytest.warns(DeprecationWarning, match=r"say retention=Retention\(key=, on_expiry=, keep=\)") as warned:
        old = long_tool(name="long_old", title="Long", description="Long.", input_model=NoteInput,
                        output_model=Noted, pipeline=pipeline, personal_fields=frozenset({"text"}),
                        retention=timedelta(hours=2), on_expiry=ExpiryPolicy.HOLD,
                        keep=KeepFor(tasks=timedelta(days=3)))
    # the warning names the declaring line, not the platform's
    assert [w.filename for w in warned] == [__file__]
    assert (old.retention, old.on_expiry, old.keep) == (spec.retention, spec.on_expiry, spec.keep)

    with pytest.raises(TypeError, match=r"on_expiry and keep belong in its Retention"):
        long_tool(name="long_both", title="Long", description="Long.", input_model=NoteInput, output_model=Noted,
                  pipeline=pipeline, personal_fields=frozenset(), retention=Retention(), keep=KeepFor())
    assert "long_both" not in _TOOLS

    # nothing said: the defaults, as before
    default = long_tool(name="long_default", title="Long", description="Long.", input_model=NoteInput,
                        output_model=Noted, pipeline=pipeline, personal_fields=frozenset())
    assert (default.retention, default.on_expiry, default.keep) == (Retention().key, Retention().on_expiry,
                                                                  Retention().keep)
