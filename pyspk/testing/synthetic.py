"""A deterministic synthetic conversation for benchmarks and demos: several voices
taking turns of varied length, with silences between some turns and overlapped speech
where a turn starts before the last one ends.

Each voice is a sawtooth glottal source at its own pitch (with a slow intonation
contour and a syllable-rate loudness envelope), shaped by its own three formant bumps
in the frequency domain, over a faint background noise. It is not speech, but it has
the structure diarization looks at: who talks when, with gaps and overlaps. The same
arguments give the same samples on every run (numpy's PCG64 generator).
Needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyspk.cuda.errors import InvalidArgument

__all__ = ["Recording", "Turn", "recording"]

SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class Turn:
    """One voice speaking from `start` to `end` seconds."""

    start: float
    end: float
    speaker: str


@dataclass(frozen=True)
class Recording:
    """Mono float32 samples in [-1, 1] at `sample_rate`, and the turns that made them."""

    waveform: np.ndarray
    sample_rate: int
    turns: tuple[Turn, ...]

    @property
    def seconds(self) -> float:
        return len(self.waveform) / self.sample_rate

    def as_file(self, uri: str) -> dict:
        """The recording as an in-memory pyannote file named `uri`: its samples as a
        `(1, samples)` float32 tensor (sharing this array's memory) and its rate."""
        import torch

        return {
            "waveform": torch.from_numpy(self.waveform)[None],
            "sample_rate": self.sample_rate,
            "uri": uri,
        }

    def overlap_seconds(self) -> float:
        """Seconds during which two or more voices speak."""
        active = np.zeros(len(self.waveform) // 160 + 1, dtype=np.int32)  # 10 ms frames
        for turn in self.turns:
            active[round(turn.start * 100) : round(turn.end * 100)] += 1
        return float(np.count_nonzero(active >= 2)) / 100

    def local_activity(
        self, starts: np.ndarray, frames: int, duration: float, local_speakers: int = 3
    ) -> tuple[np.ndarray, list[list[str]]]:
        """Who speaks in each frame of the chunks of `duration` seconds at `starts`:
        (chunks, frames, local_speakers) booleans and each chunk's voices, in the order
        they first speak in it (at most `local_speakers` of them); frame f is the
        instant (f + 0.5) * duration / frames."""
        times = (np.arange(frames) + 0.5) * duration / frames
        activity = np.zeros((len(starts), frames, local_speakers), dtype=bool)
        voices = []
        for row, start in enumerate(starts):
            active: dict[str, np.ndarray] = {}
            for turn in self.turns:
                speaking = (times + start >= turn.start) & (times + start < turn.end)
                if speaking.any():
                    active[turn.speaker] = active.get(turn.speaker, False) | speaking
            order = sorted(active, key=lambda voice: int(np.argmax(active[voice])))
            voices.append(order[:local_speakers])
            for slot, voice in enumerate(voices[-1]):
                activity[row, :, slot] = active[voice]
        return activity, voices

    def powerset_targets(
        self, starts: np.ndarray, frames: int, duration: float, local_speakers: int = 3
    ) -> np.ndarray:
        """(chunks, frames) powerset classes of the chunks of `duration` seconds at
        `starts`, as segmentation-3.0 numbers them (0: nobody, then each local speaker
        alone, then each pair), over `local_activity`'s local speakers."""
        singles = [(i,) for i in range(local_speakers)]
        pairs = [(i, j) for i in range(local_speakers) for j in range(i + 1, local_speakers)]
        classes = [(), *singles, *pairs]
        activity, _ = self.local_activity(starts, frames, duration, local_speakers)
        targets = np.zeros(activity.shape[:2], dtype=np.int64)
        for index, members in enumerate(classes):
            wanted = np.zeros(local_speakers, dtype=bool)
            wanted[list(members)] = True
            targets[(activity == wanted).all(axis=2)] = index
        return targets

    def silence_seconds(self) -> float:
        """Seconds during which no voice speaks."""
        active = np.zeros(len(self.waveform) // 160, dtype=bool)
        for turn in self.turns:
            active[round(turn.start * 100) : round(turn.end * 100)] = True
        return float(np.count_nonzero(~active)) / 100


@dataclass(frozen=True)
class _Voice:
    pitch: float  # Hz
    formants: tuple[float, float, float]  # Hz
    level: float


def _voices(rng: np.random.Generator, count: int) -> list[_Voice]:
    voices = []
    for index in range(count):
        low = index % 2 == 0  # alternate lower and higher voices
        pitch = rng.uniform(95, 140) if low else rng.uniform(170, 240)
        formants = (rng.uniform(450, 800), rng.uniform(1100, 1900), rng.uniform(2300, 3200))
        voices.append(_Voice(pitch, formants, rng.uniform(0.6, 1.0)))
    return voices


def _turns(rng: np.random.Generator, seconds: float, speakers: int) -> list[Turn]:
    """Turns of 0.5 to 12 s (log-normal around 2.5 s); after each, a silence (40%), an
    overlap of 0.3 to 2 s (20%) or an immediate change of speaker."""
    turns: list[Turn] = []
    t = rng.uniform(0.5, 2.0)
    current = int(rng.integers(speakers))
    while t < seconds - 0.5:
        length = float(np.clip(rng.lognormal(np.log(2.5), 0.7), 0.5, 12.0))
        end = min(t + length, seconds)
        turns.append(Turn(round(t, 3), round(end, 3), f"voice{current}"))
        following = rng.random()
        if following < 0.4:
            t = end + rng.uniform(0.3, 4.0)
        elif following < 0.6:
            t = max(end - rng.uniform(0.3, 2.0), t + 0.2)
        else:
            t = end
        current = (current + int(rng.integers(1, speakers))) % speakers
    return turns


def _speak(rng: np.random.Generator, voice: _Voice, samples: int, rate: int) -> np.ndarray:
    """`samples` of one voice: intonated sawtooth, syllable envelope, formant shaping."""
    t = np.arange(samples) / rate
    contour = 1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.2, 0.6) * t + rng.uniform(0, 6.3))
    phase = np.cumsum(voice.pitch * contour / rate)
    source = 2 * (phase - np.floor(phase)) - 1
    syllables = 0.55 + 0.45 * np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 6.3))
    fade = np.minimum(1, np.minimum(t, t[-1] - t) / 0.02)  # 20 ms ramps: no clicks
    size = 1 << (samples - 1).bit_length()  # a power of two: a fast transform
    spectrum = np.fft.rfft(source * syllables * fade, n=size)
    frequencies = np.fft.rfftfreq(size, 1 / rate)
    shape = sum(
        np.exp(-0.5 * ((frequencies - formant) / (60 + 0.08 * formant)) ** 2) / (1 + i)
        for i, formant in enumerate(voice.formants)
    )
    return voice.level * np.fft.irfft(spectrum * (0.02 + shape), n=size)[:samples]


def recording(
    seconds: float, seed: int = 0, speakers: int = 4, sample_rate: int = SAMPLE_RATE
) -> Recording:
    """A synthetic conversation of `seconds` among `speakers` voices (2 or more)."""
    if not seconds > 0:
        raise InvalidArgument(f"seconds must be positive, not {seconds}")
    if speakers < 2:
        raise InvalidArgument(f"a conversation needs at least 2 speakers, not {speakers}")
    rng = np.random.default_rng(seed)
    voices = _voices(rng, speakers)
    turns = _turns(rng, seconds, speakers)
    total = round(seconds * sample_rate)
    signal = 0.003 * rng.standard_normal(total)  # background noise
    for turn in turns:
        first, last = round(turn.start * sample_rate), round(turn.end * sample_rate)
        voice = voices[int(turn.speaker.removeprefix("voice"))]
        signal[first:last] += _speak(rng, voice, last - first, sample_rate)
    signal *= 0.5 / max(float(np.max(np.abs(signal))), 1e-9)
    return Recording(signal.astype(np.float32), sample_rate, tuple(turns))
