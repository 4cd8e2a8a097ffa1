"""GPU device loss (issue 19): a lost device (here destroyed, as a driver reset or a backgrounded tab would lose it)
surfaces as a clear DeviceError on the next run, in Python and in Chromium, and loading the package again gives a
session on a new device that runs correctly, without restarting the process or reloading the page."""

from __future__ import annotations

import numpy as np
import pytest
from browser import CHROMIUM, ConsoleLog, serving, sync_playwright_alone
from conftest import save_tiny_relu_matmul

import kiln
from kiln.errors import DeviceError, DeviceLostError

W = np.array([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]], np.float32)
X = np.array([[1.0, 2.0]], np.float32)
WANT = np.maximum(X @ W, 0)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """``y = relu(x @ W)`` for webgpu."""
    folder = tmp_path_factory.mktemp("device_loss")
    save_tiny_relu_matmul(folder / "tiny.onnx", W)
    return kiln.compile(str(folder / "tiny.onnx"), str(folder / "pkg"), device_class="cpu")


@pytest.mark.parametrize("device", ["shared", "own"])
def test_lost_device_natively(package, device):
    """After ``session.device.destroy()`` a run is a one-line DeviceLostError (a DeviceError) saying to load the
    package again; a new ``kiln.load`` (on the shared device too: the lost one is not handed out again) runs
    correctly, and GPU tensors of the lost device are refused by name."""
    session = kiln.load(package, device=device)
    np.testing.assert_allclose(session.run({"x": X})["y"], WANT, rtol=1e-6)
    session.device.destroy()
    with pytest.raises(DeviceLostError, match="the GPU device was lost") as info:
        session.run({"x": X})
    assert isinstance(info.value, DeviceError) and "kiln.load" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(DeviceLostError):
        session.run({"x": X})  # and stays so
    for other in (lambda: session.upload(X), lambda: session.profile({"x": X}, repeat=1)):  # (not runs only)
        with pytest.raises(DeviceLostError, match="the GPU device was lost"):
            other()
    again = kiln.load(package, device=device)
    assert again.device is not session.device
    np.testing.assert_allclose(again.run({"x": X})["y"], WANT, rtol=1e-6)
    np.testing.assert_allclose(again.run({"x": again.upload(X)})["y"], WANT, rtol=1e-6)


def test_eager_tensors_and_single_kernels_after_the_shared_device_is_lost(package):
    """Eager tensors and single-kernel runs made before the shared device is lost move to the new device after it
    (both once kept the lost device for the process's life: every later eager op and ``KernelRunner`` failed)."""
    import kiln.eager as ke
    from kiln.runtime.gpu import is_lost
    from kiln.runtime.kernel import KernelRunner, device

    before = device()
    np.testing.assert_allclose((ke.tensor(X) * 2.0).numpy(), X * 2)
    session = kiln.load(package, device="shared")
    assert session.device is before  # (one process-wide device)
    session.device.destroy()
    with pytest.raises(DeviceLostError):
        session.run({"x": X})
    assert is_lost(before) and device() is not before
    np.testing.assert_allclose((ke.tensor(X) * 2.0).numpy(), X * 2)
    src = """@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(2) fn main(@builtin(local_invocation_index) i: u32) { y[i] = x[i] + 1.0; }"""
    np.testing.assert_allclose(KernelRunner(src, [X.ravel()], 2, (1, 1, 1)).run(), X.ravel() + 1)


LOSE_AND_RELOAD = """async ({x}) => {
  const kiln = await import('./kiln.js');
  const feeds = () => ({x: new kiln.Tensor('float32', Float32Array.from(x), [1, 2])});
  const first = await kiln.load('./', {target: 'webgpu'});
  const before = Array.from((await first.run(feeds())).y.data);
  first.device.destroy();
  await new Promise((resolve) => setTimeout(resolve, 50));
  let error = 'no error';
  try {
    await first.run(feeds());
  } catch (e) {
    error = `${e.name}: ${e.message}`;
  }
  const second = await kiln.load('./', {target: 'webgpu'});
  const after = Array.from((await second.run(feeds())).y.data);
  return {before, error, after, newDevice: second.device !== first.device};
}"""


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (Debian package chromium)")
def test_lost_device_in_the_browser(package):
    """In Chromium: the page's shared device destroyed, the session's next run is a DeviceError saying the device was
    lost; ``kiln.load`` again (same page) gets a new device and the right answer."""
    from browser import launch_chromium

    with sync_playwright_alone() as playwright, serving(package) as url:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page()
            log = ConsoleLog(page)
            page.goto(url + "manifest.json")
            got = log.evaluate(LOSE_AND_RELOAD, {"x": X.ravel().tolist()})
        finally:
            browser.close()
    np.testing.assert_allclose(got["before"], WANT.ravel(), rtol=1e-6)
    assert got["error"].startswith("DeviceError: ") and "was lost" in got["error"], got["error"]
    assert got["newDevice"]
    np.testing.assert_allclose(got["after"], WANT.ravel(), rtol=1e-6)
