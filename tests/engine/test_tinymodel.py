from __future__ import annotations

import json
import struct

import numpy as np

from workers.engine.tinymodel import _bf16_bytes, build_model, main, read_revisions


def read_safetensors_header(path):
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def test_it_builds_a_loadable_llama_layout(tmp_path):
    out = build_model(tmp_path / "tiny", revision="rev-a")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["vocab_size"], config["hidden_size"], config["intermediate_size"]) == (2048, 128, 256)
    assert (config["num_hidden_layers"], config["num_attention_heads"]) == (2, 4)
    assert config["max_position_embeddings"] == 8192
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 3)
    header, blob = read_safetensors_header(out / "model.safetensors")
    assert header["model.embed_tokens.weight"] == {
        "dtype": "BF16",
        "shape": [2048, 128],
        "data_offsets": [0, 2048 * 128 * 2],
    }
    assert header["model.layers.1.mlp.down_proj.weight"]["shape"] == [128, 256]
    assert max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__") == len(blob)
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    assert read_revisions(out) == {"model_revision": "rev-a", "tokenizer_revision": "rev-a"}
    assert read_revisions(tmp_path) is None


def test_it_is_deterministic_for_a_seed(tmp_path):
    main(["--out", str(tmp_path / "a"), "--seed", "3"])
    main(["--out", str(tmp_path / "b"), "--seed", "3"])
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()


def test_it_rounds_float32_to_bfloat16():
    values = np.array([1.0, -2.0, 0.1, 3.0e38], dtype=np.float32)
    halves = np.frombuffer(_bf16_bytes(values), dtype="<u2")
    back = (halves.astype(np.uint32) << 16).view(np.float32)
    assert back[0] == 1.0 and back[1] == -2.0
    assert abs(back[2] - 0.1) < 0.001 and np.isfinite(back[3])
