"""The fine-tuning demo in headless Chromium (WebGPU on SwiftShader): MobileNetV2's new classifier trained by
``session.trainStep`` on crops of the sample photos (examples/finetune/build.py, the package's train.html)."""

from __future__ import annotations

import base64
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from browser import ConsoleLog, serving

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "finetune"))
from build import HEAD, build, new_head_model

#: the page's trained weights as base64 safetensors bytes
EXPORT = """async () => {
  const bytes = await window.kilnSession.exportWeights();
  let text = '';
  for (let i = 0; i < bytes.length; i += 8192) text += String.fromCharCode(...bytes.subarray(i, i + 8192));
  return btoa(text);
}"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo at 96 x 96 pixels, batch 8: 2 training and 2 held-out crops of each of 4 classes (SwiftShader is
    slow, so one batch holds the whole training set)."""
    return build(tmp_path_factory.mktemp("finetune") / "demo", size=96, batch=8, train=2, test=2, lr=1e-2,
                 device_class="cpu")


def test_finetuning_demo_loss_falls_and_held_out_accuracy_rises(browser, demo):
    page = browser.new_page()
    log = ConsoleLog(page)
    with serving(demo) as url:
        page.goto(url + "train.html?steps=4")
        page.wait_for_function("window.kilnFinetune && window.kilnFinetune.done", timeout=600_000)
        result = log.evaluate("() => window.kilnFinetune")
        assert result["error"] is None, f"{result['error']}\n{log.report()}"
        losses = result["losses"]
        assert len(losses) == 4 and all(np.isfinite(losses)), losses
        assert losses[-1] < 0.5 * losses[0], f"the loss did not fall: {losses}"
        chance = 0.25
        assert result["after"] > chance and result["after"] >= result["before"], result
        raw = base64.b64decode(log.evaluate(EXPORT))
    page.close()
    n = struct.unpack("<Q", raw[:8])[0]
    import json

    header = json.loads(raw[8:8 + n])
    init = {t.name: np.frombuffer(t.raw_data, np.float32) for t in new_head_model(4, 96).graph.initializer
            if t.name in HEAD}
    for name in HEAD:
        entry = header[name]
        assert entry["dtype"] == "F32" and entry["shape"] == ([4, 1280] if name.endswith("weight") else [4])
        a, b = entry["data_offsets"]
        w = np.frombuffer(raw[8 + n + a:8 + n + b], np.float32)
        assert np.isfinite(w).all() and not np.allclose(w, init[name]), f"{name} was not trained"
