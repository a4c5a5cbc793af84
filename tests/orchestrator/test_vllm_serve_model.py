"""The `vllm serve` line names the model the scenario asked for; checkpoint directories load."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from orchestrator.sweep.vllm_command import vllm_serve_command
from sim.errors import ConfigError
from sim.specs.catalog import load_model, serve_model_id
from sim.specs.scenario import load_scenario_file

CONFIG_8B = REPO / "sim" / "data" / "models" / "meta-llama--Meta-Llama-3.1-8B_config.json"


def _scenario(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f'[hardware]\nname = "h100_sxm"\n[model]\nname = "{model}"\n'
                    '[engine]\nmax_model_len = 8192\n')
    return path


@pytest.mark.parametrize(("asked", "served"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Meta-Llama-3.1-70B", "meta-llama/Llama-3.1-70B"),
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8"),
])
def test_serve_line_names_the_asked_model_under_its_current_repo_id(tmp_path: Path, asked: str, served: str) -> None:
    line = vllm_serve_command(load_scenario_file(_scenario(tmp_path, asked)))
    assert line.startswith(f"vllm serve {served} --tensor-parallel-size 1")


def test_config_json_path_serves_its_directory(tmp_path: Path) -> None:
    ckpt = tmp_path / "my-ckpt"
    ckpt.mkdir()
    shutil.copy(CONFIG_8B, ckpt / "config.json")
    line = vllm_serve_command(load_scenario_file(_scenario(tmp_path, "my-ckpt/config.json")))
    assert line.startswith(f"vllm serve {ckpt} --tensor-parallel-size 1")


def test_checkpoint_directory_loads_like_hugging_face_tools_load_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "my-ckpt"
    ckpt.mkdir()
    shutil.copy(CONFIG_8B, ckpt / "config.json")
    # relative to the scenario file, as config.json paths are
    scenario = load_scenario_file(_scenario(tmp_path, "my-ckpt"))
    assert scenario.model.num_layers == 32
    assert vllm_serve_command(scenario).startswith(f"vllm serve {ckpt} ")
    assert load_model(str(ckpt)).hidden_size == 4096
    assert serve_model_id(str(ckpt)) == str(ckpt)


def test_directory_without_config_json_is_an_unknown_model(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="unknown model id"):
        load_model(str(tmp_path / "empty"))


def test_unknown_model_id_suggests_the_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("did you mean 'meta-llama/Llama-3.1-8B-Instruct'")):
        load_model("meta-llama/Llama-3.1-8B-Instruc")


def test_eplb_settings_reach_the_serve_line(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[hardware]\nname = "h200_sxm"\n[model]\nname = "deepseek-ai/DeepSeek-R1"\n'
                    '[engine]\nmax_model_len = 4096\ndata_parallel_size = 8\nenable_expert_parallel = true\n'
                    'kv_cache_dtype = "fp8"\nenable_eplb = true\nnum_redundant_experts = 32\n')
    line = vllm_serve_command(load_scenario_file(path))
    assert "--enable-expert-parallel --enable-eplb" in line
    assert line.endswith("""--eplb-config '{"num_redundant_experts": 32}'""")


def test_an_engine_priced_with_deepep_asks_vllm_for_it() -> None:
    """The simulator prices the expert token exchange over attention-DP ranks as DeepEP; vLLM's default
    all2all backend is `allgather_reducescatter` (before 2026-12-02 the launch line did not ask)."""
    from orchestrator.sweep.vllm_command import vllm_pool_commands
    from sim.api import load_scenario

    repo = Path(__file__).resolve().parents[2]
    dp = vllm_serve_command(load_scenario(repo / "scenarios" / "deepseek_r1-h200-dp8ep8.toml"))
    assert "--all2all-backend deepep_low_latency" in dp
    assert "--all2all-backend" not in vllm_serve_command(load_scenario(repo / "scenarios" / "deepseek_r1-h200-tp8.toml"))
    pools = vllm_pool_commands(load_scenario(repo / "scenarios" / "deepseek_r1-h200-disagg-4p8d.toml"))
    assert "--all2all-backend" not in pools["prefill"]  # TP8: no token exchange
    assert "--all2all-backend deepep_low_latency" in pools["decode"]
