#!/usr/bin/env python3
"""Writes CIFAR-10's binary batches (what `sinter train --data cifar10:DIR` reads) from the
python version of the data set (the `cifar-10-batches-py` folder that torchvision and many
repositories keep), whole or cut short.

    python3 bench/cifar10_from_python.py SRC_DIR OUT_DIR

SRC_DIR holds data_batch_1 … data_batch_5 and test_batch (the original Python-2 pickles);
OUT_DIR/cifar-10-batches-bin/ gets data_batch_1.bin … test_batch.bin (1 label byte + 3072
pixel bytes per image). A file cut short (some public copies keep only each file's first
few MiB) gives its whole images only; the count per file and per class is printed. Only the
standard library is used: the pickle is read by its opcodes (labels list, then the pixel
bytes of the numpy array), not unpickled, so no numpy is needed and no code in it runs.
"""
import os
import sys

IMAGES, PIXELS = 10000, 3072
# BINSTRING opcode + the little-endian length of 10000 × 3072 bytes: the numpy array's data.
DATA_MARK = b"T" + (IMAGES * PIXELS).to_bytes(4, "little")


def fail(msg):
    sys.exit(f"cifar10_from_python: {msg}")


def labels_of(raw, src):
    """The 10,000 labels: the pickled list after the key 'labels' (opcodes q ] ( K e)."""
    at = raw.find(b"U\x06labels")
    if at < 0:
        fail(f"{src}: no 'labels' key: not a CIFAR-10 python batch (CIFAR-100 uses 'fine_labels')")
    i, labels = at + 8, []
    while i < len(raw) and raw[i] != ord("U"):
        op = raw[i]
        if op == ord("K"):
            labels.append(raw[i + 1])
            i += 2
        elif op == ord("q"):
            i += 2
        elif op in b"](e":
            i += 1
        else:
            fail(f"{src}: unexpected pickle opcode {chr(op)!r} at byte {i} in the labels list")
    if len(labels) != IMAGES or max(labels) > 9:
        fail(f"{src}: {len(labels)} labels (max {max(labels, default=0)}), expected {IMAGES} in 0..9")
    return labels


def convert(src, dst):
    with open(src, "rb") as f:
        raw = f.read()
    labels = labels_of(raw, src)
    start = raw.find(DATA_MARK)
    if start < 0:
        fail(f"{src}: no 10000×3072 pixel array after the labels (file cut before it?)")
    start += len(DATA_MARK)
    n = min(IMAGES, (len(raw) - start) // PIXELS)
    if n == 0:
        fail(f"{src}: not one whole image in the file")
    tmp = dst + ".partial"
    with open(tmp, "wb") as f:
        for k in range(n):
            f.write(bytes([labels[k]]))
            f.write(raw[start + PIXELS * k : start + PIXELS * (k + 1)])
    os.replace(tmp, dst)
    per_class = [labels[:n].count(c) for c in range(10)]
    print(f"{dst}: {n} images, per class {per_class}")


def main():
    if len(sys.argv) != 3:
        fail("usage: cifar10_from_python.py SRC_DIR OUT_DIR")
    src, out = sys.argv[1], os.path.join(sys.argv[2], "cifar-10-batches-bin")
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not os.path.isfile(os.path.join(src, n))]
    if missing:
        fail(f"{src}: missing {', '.join(missing)} (expected the cifar-10-batches-py folder)")
    os.makedirs(out, exist_ok=True)
    for name in names:
        convert(os.path.join(src, name), os.path.join(out, name + ".bin"))


if __name__ == "__main__":
    main()
