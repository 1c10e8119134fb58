"""``sky.plugins.huggingface()``: the libraries, a cache that outlives the pool, and the
client's token on every worker without its being written anywhere."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

import skyward as sky
from skyward.plugins._huggingface import client_token
from skyward.pool.spec import PoolSpec
from skyward.providers.ssh.bootstrap import Plan, render

TOKEN = "hf_TestTokenNotARealOne42"


@sky.compute
def token_and_cache() -> tuple[str | None, str | None, int]:
    import os

    return os.environ.get("HF_TOKEN"), os.environ.get("HF_HOME"), os.getpid()


def test_the_token_reaches_every_worker_and_no_command_line_image_script_or_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SKYWARD_LOG_DIR", str(tmp_path / "logs"))
    plugin = sky.plugins.huggingface(TOKEN, cache=str(tmp_path / "hf"), transformers=False)
    with sky.ComputePool(nodes=2, plugins=[plugin], console="off") as pool:
        seen = token_and_cache() @ pool
        command_lines = [" ".join(psutil.Process(pid).cmdline()) for _, _, pid in seen]
        image = pool.image
    assert [(t, h) for t, h, _ in seen] == [(TOKEN, str(tmp_path / "hf"))] * 2
    assert all(TOKEN not in line for line in command_lines)
    assert TOKEN not in image.model_dump_json()
    script = render(Plan(image, "3.11", None, "~/.cache/skyward", ()))
    assert TOKEN not in script
    logged = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*") if p.is_file())
    assert logged and TOKEN not in logged


def test_the_token_defaults_to_the_clients_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert client_token() is None
    (tmp_path / "token").write_text("hf_from_cli_login\n")  # what huggingface-cli login saves
    assert client_token() == "hf_from_cli_login"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert client_token() == "hf_from_env"


def test_the_libraries_asked_for_are_installed() -> None:
    plugin = sky.plugins.huggingface(datasets=True, accelerate=True)
    assert plugin.transform is not None
    image = plugin.transform(sky.Image(), PoolSpec(provider=sky.Local()))
    assert image.pip == ("transformers", "datasets", "accelerate")


@sky.compute
def train_tiny_bert() -> list[float]:
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=2,
    )
    model = DistributedDataParallel(BertForSequenceClassification(config))  # built, not downloaded
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    node = sky.instance_info().node
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(node))
    labels = torch.tensor([0, 1, 0, 1])
    model(input_ids=ids, labels=labels).loss.backward()
    optimiser.step()
    return [float(p.detach().sum()) for p in model.parameters()][:6]


def test_a_tiny_model_from_a_config_trains_a_step_on_two_nodes_with_torch() -> None:
    plugins = [sky.plugins.torch(), sky.plugins.huggingface()]
    with sky.ComputePool(nodes=2, plugins=plugins, console="off") as pool:
        sums = train_tiny_bert() @ pool
    assert sums[0] == sums[1]  # different data per node, the same weights after the step
