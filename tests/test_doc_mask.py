"""Document masking in packed sequences (--doc-len, or the --data documents' lengths): what transformers builds for
each attention implementation, the ledger's terms against the simulation, the step-time terms, the flag's errors and
the exports."""

from __future__ import annotations

import json

import pytest

from advisor.core.errors import AdvisorInputError
from advisor.core.packed_docs import (builds_packed_mask, documents_per_row, packed_attention_scale, row_documents,
                                      token_weighted_length, varlen_attention_scale)
from advisor.core.plan import Plan

PACKED = Plan(method="lora", packing=True, seq_len=8192, doc_len=2048)


def test_a_row_holds_whole_documents_and_a_shorter_last_one():
    assert row_documents(8192, 2048) == (2048,) * 4
    assert row_documents(100, 40) == (40, 40, 20)
    assert row_documents(96, 96) == (96,)
    assert row_documents(96, None) == (48, 48)  # not stated: a packed row, wherever the documents meet
    assert documents_per_row(PACKED) == 4 and documents_per_row(PACKED.with_(packing=False, doc_len=None)) == 1


def test_which_implementations_build_the_mask():
    assert builds_packed_mask(PACKED) and builds_packed_mask(PACKED.with_(attn_impl="eager"))
    assert not builds_packed_mask(PACKED.with_(attn_impl="flash_attention_2"))
    assert not builds_packed_mask(PACKED.with_(doc_len=8192))  # one document per row: an ordinary causal row


@pytest.mark.parametrize("kw,match", [
    (dict(doc_len=512), "--doc-len: is the length of packed documents: add --packing"),
    (dict(packing=True, seq_len=1024, doc_len=2048), "--doc-len: a packed sequence holds whole documents of at most "
                                                     "--seq-len 1024 tokens"),
    (dict(packing=True, doc_len=0), "--doc-len: must be a whole number of at least 1"),
])
def test_the_flag_is_validated_with_one_line_errors(kw, match):
    with pytest.raises(AdvisorInputError, match=match) as e:
        Plan(**kw).validate()
    assert "\n" not in str(e.value)


def test_the_data_gives_its_token_weighted_length():
    from advisor.core.data_profile import DataProfile

    d = DataProfile(tuple([200] * 50 + [1000] * 10), "x", "given")
    plan = d.sized(Plan(packing=True, seq_len=4096))
    assert plan.doc_len == token_weighted_length(d.lengths, 4096) == round((50 * 200**2 + 10 * 1000**2) / 20000)
    # the uniform rows of that length cost what these documents do under flash varlen (the row's last one is cut)
    flash = plan.with_(attn_impl="flash_attention_2")
    assert varlen_attention_scale(flash) == pytest.approx(packed_attention_scale(d.lengths, 4096), rel=0.03)
    with pytest.raises(AdvisorInputError, match="--doc-len: the --data documents give their own lengths"):
        d.sized(Plan(packing=True, seq_len=4096, doc_len=512))


def test_position_ids_are_what_the_flattening_collator_gives():
    """build.packed_position_ids equals transformers' DataCollatorWithFlattening over documents of those lengths,
    and transformers' own find_packed_sequence_indices sees as many documents."""
    torch = pytest.importorskip("torch")
    from transformers import DataCollatorWithFlattening
    from transformers.masking_utils import find_packed_sequence_indices

    from advisor.runtime.build import packed_position_ids

    ids = torch.zeros(1, 100, dtype=torch.long)
    ours = packed_position_ids(ids, 40)
    docs = [{"input_ids": list(range(n))} for n in row_documents(100, 40)]
    theirs = DataCollatorWithFlattening(return_tensors="pt")(docs)["position_ids"]
    assert torch.equal(ours, theirs)
    assert int(find_packed_sequence_indices(ours)[0, -1]) + 1 == 3
    assert find_packed_sequence_indices(packed_position_ids(ids, 100)) is None


def test_the_sdpa_mask_is_what_transformers_builds():
    """transformers 5's create_causal_mask on packed position_ids: a bool [b, 1, s, s] block-diagonal causal mask for
    sdpa, the same as an additive float mask for eager, none for flash-attention (varlen)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.masking_utils import create_causal_mask

    from advisor.memory.loss_dora_packing import packed_mask_bytes
    from advisor.runtime.build import packed_position_ids
    from advisor.runtime.simulate.tiny import tiny_spec

    b, s = 2, 64
    emb = torch.zeros(b, s, 8)
    pos = packed_position_ids(torch.zeros(b, s, dtype=torch.long), 16)
    for impl in ("sdpa", "eager", "flash_attention_2"):
        cfg = LlamaConfig(hidden_size=8, num_attention_heads=1, num_key_value_heads=1)
        cfg._attn_implementation = impl
        mask = create_causal_mask(config=cfg, inputs_embeds=emb, attention_mask=None, cache=None, position_ids=pos)
        plan = Plan(method="lora", packing=True, seq_len=s, micro_batch=b, doc_len=16, attn_impl=impl)
        if impl == "flash_attention_2":
            assert mask is None and packed_mask_bytes(tiny_spec("llama"), plan) == 0
            continue
        assert mask.shape == (b, 1, s, s)
        if impl == "sdpa":
            assert mask.dtype == torch.bool and mask.numel() * mask.element_size() == packed_mask_bytes(
                tiny_spec("llama"), plan)
            assert bool(mask[0, 0, 17, 16]) and not bool(mask[0, 0, 17, 15])  # the second document sees itself only


def test_attention_time_of_packed_rows():
    """flash varlen: sum(doc_len^2), so the attention term falls with the documents; sdpa's masked kernel computes
    the whole seq^2, twice the causal half of an unpacked row, whatever the documents."""
    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.speed.throughput import predict_throughput

    m, g = resolve_model("llama8b"), resolve_gpu("h200")
    plan = Plan(method="qlora", quantization="nf4", gradient_checkpointing=True, seq_len=32768)
    att = {}
    for impl in ("flash_attention_2", "sdpa"):
        for doc in (None, 2048, 8192):
            p = plan.with_(attn_impl=impl, packing=doc is not None, doc_len=doc)
            att[impl, doc] = predict_throughput(m, p, g).terms["attention"]
    half = 2048 / (2048 + 512) / (32768 / (32768 + 512))  # the tiles of a 2K document fill less (attention_half_seq)
    assert att["flash_attention_2", 2048] == pytest.approx(att["flash_attention_2", None] * 2048 / 32768 / half)
    assert att["flash_attention_2", 8192] < 4 * att["flash_attention_2", 2048] * 1.01
    assert att["sdpa", 2048] == pytest.approx(2 * att["sdpa", None]) == pytest.approx(att["sdpa", 8192])


def test_estimate_takes_the_flag_and_refuses_it_beside_data(tmp_path, capsys):
    from advisor.cli import main

    args = ["estimate", "--model", "qwen7b", "--seq-len", "4096", "--packing", "--doc-len", "1024", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["doc_len"] == 1024 and "doc1024" in d["plan_short"]
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("120\n300\n900\n40\n")
    assert main(args + ["--data", str(lengths)]) == 2
    err = capsys.readouterr().err
    assert "--doc-len: the --data documents give their own lengths" in err and len(err.strip().splitlines()) == 1
    assert main(args[:-3] + ["--data", str(lengths), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["doc_len"] == token_weighted_length((120, 300, 900, 40), 4096)


@pytest.mark.parametrize("fmt", ["advisor", "trl", "axolotl", "llamafactory"])
def test_every_format_writes_a_plan_with_documents(tmp_path, fmt):
    """The documents' length is the data's: advisor.yaml keeps it, the tools' files need no key (their packing
    collator reads the data) and write the packing keys they take."""
    from advisor.configs.export import export_plan
    from advisor.configs.read import read_config
    from advisor.core.catalog import resolve_model

    plan = Plan(method="lora", packing=True, seq_len=4096, doc_len=1024, attn_impl="flash_attention_2")
    written = export_plan(resolve_model("qwen7b"), plan, tmp_path, [fmt])
    path = next(iter(written.values())) if isinstance(written, dict) else written[0]
    _, back, _ = read_config(path, check_fields=False)
    assert back.packing and back.doc_len == (1024 if fmt == "advisor" else None)
    text = path.read_text()
    assert {"trl": "packing_strategy: bfd", "axolotl": "sample_packing: true", "llamafactory": "neat_packing: true",
            "advisor": "doc_len: 1024"}[fmt] in text
