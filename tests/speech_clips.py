"""Speech test clips: known sentences spoken by Debian's espeak-ng (several voices and speeds, one clip over 30 s),
made at test time, resampled from espeak-ng's 22050 Hz to 16 kHz by PyAV (faster-whisper's ``decode_audio``), so
Kiln and the reference get the very same samples. No registry package ships real speech."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Clip:
    """A clip: its name, espeak-ng voice and speed (words a minute) and the sentences spoken."""

    name: str
    voice: str
    speed: int
    text: str


CLIPS = [
    Clip("fox_us", "en-us", 150, "The quick brown fox jumps over the lazy dog. A compiler turns models into code."),
    Clip("weather_gb", "en-gb-x-rp", 130, "It will rain in the morning, and the afternoon should be bright and warm."),
    Clip("numbers_fast", "en-us+f3", 190, "Please call me back before five o'clock on Tuesday. Thank you very much."),
    # over 30 s: two windows, the second prompted with the first's text
    Clip("story_long", "en-us", 140,
         "Once upon a time there was a small village by the sea. Every morning the fishermen went out in their "
         "boats, and every evening they came back with their nets full of fish. The children played on the beach "
         "while their parents worked. One day a great storm came from the west. The wind was strong and the waves "
         "were high, so nobody went to sea for three days. When the storm was over, the people of the village "
         "walked along the shore and found that the sea had left many beautiful shells on the sand. They collected "
         "the shells and sold them at the market in the town."),
]


def espeak_available() -> bool:
    """Whether espeak-ng is installed (setup.sh installs it)."""
    return shutil.which("espeak-ng") is not None


def make_clip(clip: Clip, folder: Path) -> tuple[Path, np.ndarray]:
    """Speak ``clip`` into ``folder``: its 16 kHz WAV file and samples (float32)."""
    import soundfile
    from faster_whisper.audio import decode_audio

    raw = folder / f"{clip.name}_22k.wav"
    subprocess.run(["espeak-ng", "-v", clip.voice, "-s", str(clip.speed), "-w", str(raw), clip.text], check=True,
                   capture_output=True)
    samples = decode_audio(str(raw), sampling_rate=16000)
    path = folder / f"{clip.name}.wav"
    soundfile.write(str(path), samples, 16000, subtype="FLOAT")
    return path, samples


def words(text: str) -> list[str]:
    """Lower-case words without punctuation (numbers as written), for the word error rate."""
    import re

    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words: the Levenshtein distance over words."""
    r, h = words(reference), words(hypothesis)
    d = np.arange(len(h) + 1)
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            cur = min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
            prev, d[j] = d[j], cur
    return float(d[len(h)]) / max(len(r), 1)
