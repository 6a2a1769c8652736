#!/usr/bin/env python3
"""Generate the two small training sets that `pypto_lab.data` loads: an image folder in torchvision
``ImageFolder`` layout (``datasets/train_images/<class>/<n>.png``) and a short-text classification
file (``datasets/train_text/train_text.csv``, columns ``text,label``).

    python scripts/make_train_datasets.py [--out datasets] [--seed 0]

Everything is drawn or composed here from a fixed seed, so the output is the same on every run
(with the same Pillow version) and is this project's own work, released under Apache-2.0. No
image or sentence comes from another source.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

from PIL import Image, ImageDraw

IMAGE_SIZE = 32
IMAGES_PER_CLASS = 24
IMAGE_CLASSES = ("circle", "square", "stripes")

# short-text classes: each line is one template filled from its class's own word lists
TEXT_TEMPLATES: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "weather": (
        (
            "the {time} will be {state} with {wind} winds",
            "expect {state} skies over the {place} this {time}",
            "{wind} winds and {state} weather reach the {place}",
            "it stays {state} near the {place} all {time}",
        ),
        {
            "time": ("morning", "afternoon", "evening", "night", "weekend", "week"),
            "state": ("sunny", "rainy", "cloudy", "foggy", "snowy", "stormy", "dry", "humid"),
            "wind": ("light", "strong", "gusty", "cold", "warm", "northerly"),
            "place": ("coast", "hills", "valley", "city", "lake", "plains"),
        },
    ),
    "food": (
        (
            "this {dish} tastes {taste} with a little {extra}",
            "we cooked {dish} for {meal} and added {extra}",
            "the {taste} {dish} was the best part of {meal}",
            "add {extra} to the {dish} before {meal}",
        ),
        {
            "dish": ("soup", "noodles", "rice", "salad", "bread", "curry", "dumplings", "stew"),
            "taste": ("spicy", "sweet", "salty", "sour", "fresh", "rich"),
            "extra": ("garlic", "ginger", "lemon", "pepper", "basil", "butter"),
            "meal": ("breakfast", "lunch", "dinner", "supper"),
        },
    ),
    "hardware": (
        (
            "the {part} runs {speed} after the {action}",
            "we replaced the {part} because it was {fault}",
            "a {fault} {part} slows down the {device}",
            "the {device} needs a {speed} {part} after the {action}",
        ),
        {
            "part": ("fan", "disk", "cable", "battery", "memory", "board", "socket", "switch"),
            "speed": ("faster", "slower", "hotter", "quieter", "cooler"),
            "action": ("upgrade", "reboot", "repair", "update", "cleaning"),
            "fault": ("broken", "loose", "noisy", "worn", "overheating"),
            "device": ("server", "laptop", "router", "printer", "camera"),
        },
    ),
    "travel": (
        (
            "our {vehicle} to the {place} leaves at {hour}",
            "we booked a {room} near the {place} for the trip",
            "the {vehicle} was {delay} so we missed the {place}",
            "pack a {item} for the {vehicle} ride to the {place}",
        ),
        {
            "vehicle": ("train", "bus", "ferry", "flight", "taxi", "tram"),
            "place": ("station", "harbour", "museum", "airport", "border", "old town"),
            "hour": ("six", "seven", "nine", "noon", "midnight"),
            "room": ("hostel", "hotel room", "cabin", "guest house"),
            "delay": ("late", "full", "cancelled", "early"),
            "item": ("map", "ticket", "passport", "jacket", "snack"),
        },
    ),
}
LINES_PER_TEXT_CLASS = 80


def _colour(rng: random.Random) -> tuple[int, int, int]:
    return (rng.randrange(256), rng.randrange(256), rng.randrange(256))


def _draw(cls: str, rng: random.Random) -> Image.Image:
    """One 32x32 RGB picture of `cls` at a random place, size and colour on a flat background."""
    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), _colour(rng))
    d = ImageDraw.Draw(img)
    fg = _colour(rng)
    if cls == "stripes":
        width = rng.randint(2, 5)
        horizontal = rng.random() < 0.5
        for p in range(rng.randrange(width * 2), IMAGE_SIZE, width * 2):
            box = (0, p, IMAGE_SIZE, p + width - 1) if horizontal else (p, 0, p + width - 1, IMAGE_SIZE)
            d.rectangle(box, fill=fg)
        return img
    r = rng.randint(6, 12)
    cx, cy = rng.randint(r, IMAGE_SIZE - r - 1), rng.randint(r, IMAGE_SIZE - r - 1)
    box = (cx - r, cy - r, cx + r, cy + r)
    if cls == "circle":
        d.ellipse(box, fill=fg)
    else:
        d.rectangle(box, fill=fg)
    return img


def make_images(out: Path, seed: int) -> int:
    rng = random.Random(seed)
    n = 0
    for cls in IMAGE_CLASSES:
        folder = out / cls
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.png"):
            old.unlink()
        for i in range(IMAGES_PER_CLASS):
            _draw(cls, rng).save(folder / f"{i:03d}.png", optimize=True)
            n += 1
    return n


def make_text(out: Path, seed: int) -> int:
    rng = random.Random(seed)
    rows: list[tuple[str, str]] = []
    for label, (templates, slots) in TEXT_TEMPLATES.items():
        seen: set[str] = set()
        while len(seen) < LINES_PER_TEXT_CLASS:
            template = rng.choice(templates)
            seen.add(template.format(**{k: rng.choice(v) for k, v in slots.items()}))
        rows += [(line, label) for line in sorted(seen)]
    rng.shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train_text.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(("text", "label"))
        w.writerows(rows)
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "datasets")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_img = make_images(args.out / "train_images", args.seed)
    n_txt = make_text(args.out / "train_text", args.seed)
    print(
        f"wrote {n_img} images to {args.out / 'train_images'} and {n_txt} lines to {args.out / 'train_text'}"
    )


if __name__ == "__main__":
    main()
