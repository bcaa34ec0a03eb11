"""API 1.2's declarations: models read from the handler's annotations, the 1.1 spelling still runs (deprecated)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from idemops.tools import (
    ExpiryPolicy,
    Found,
    KeepFor,
    Reconciliation,
    Retention,
    StrictModel,
    ToolContext,
    WriteInput,
    read_tool,
    write_tool,
)
from tools_app.toolkit.registry import _TOOLS, get_tool


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
