"""Images read in bounded memory: the header is checked before anything is decoded.

A JPEG is decoded at a reduced scale when the model needs fewer pixels (Pillow's ``draft``:
the decoder skips the fine DCT coefficients, so a 50-megapixel photo for a 224-pixel model
costs about a megapixel); any other image is decoded only when its pixel count, read from the
header, is within :data:`MAX_PIXELS`. Only the formats a camera, phone or browser writes are
opened: Pillow's other plugins (EPS hands the file to Ghostscript) never see user files.

Example:
    >>> picture = open_image("cat.jpg", size=224)
    >>> picture.mode
    'RGB'
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from hub_export.errors import InputError, first_line
from hub_export.media.files import open_regular
from hub_export.quiet import native_stderr_to_log

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger("hub_export.media")

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # JPEG includes MPO, which Pillow opens through it
MAX_PIXELS = 32_000_000  # decoded (after a JPEG's draft): about 130 MB at 4 bytes a pixel, plus its RGB copy
# Several pictures in one file that are not an animation: a phone's MPO (the photo, then depth or
# preview images) and a multi-page TIFF. Their first picture is the one shown.
_FIRST_OF_MANY = ("MPO", "TIFF")
_READABLE = "give a PNG, JPEG, WebP, GIF, BMP or TIFF file"


def open_image(path: str | Path, size: int | None = None) -> Image.Image:
    """The image at ``path`` as an RGB PIL image, decoded at no more than it takes to resize it to ``size``
    pixels a side (``None``: full size), within :data:`MAX_PIXELS`.

    Raises:
        InputError: not a regular file, not an image of :data:`FORMATS`, animated, over the pixel budget, or
            damaged (each said in one line that names the file).
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    name = path.name
    with open_regular(path, "image") as file, warnings.catch_warnings(), native_stderr_to_log(log):
        # Pillow's bomb warning and error are replaced by the budget below, which names the size.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(file, formats=FORMATS)
        except Image.DecompressionBombError as error:  # Pillow's own limit, far above ours: say its count
            pixels = re.search(r"\((\d+) pixels\)", str(error))
            count = f" ({int(pixels.group(1)) / 1e6:.0f} megapixels)" if pixels else ""
            raise InputError(
                f"{name} is over {MAX_PIXELS // 1_000_000} megapixels{count}; scale it down first"
            ) from None
        except UnidentifiedImageError:
            raise InputError(f"{name} is not an image this reads; {_READABLE}") from None
        except (OSError, ValueError, SyntaxError, EOFError) as error:
            raise InputError(f"cannot read {name} as an image ({first_line(error)[:80]}); {_READABLE}") from None
        with image:
            _check_header(image, name, size)
            try:
                image.load()
                picture = image.convert("RGB")
            except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as error:
                raise InputError(f"{name} is damaged ({first_line(error)[:80]}); {_READABLE}") from None
    return _reduced(picture, size)


def _check_header(image: Image.Image, name: str, size: int | None) -> None:
    """Refuse an animation or an over-budget image from what the header says; reduce a JPEG's decoding scale."""
    if getattr(image, "is_animated", False) and image.format not in _FIRST_OF_MANY:
        raise InputError(f"{name} is animated (several frames); give one still image")
    if size and image.format in ("JPEG", "MPO"):
        image.draft("RGB", (size, size))  # decodes at 1/2, 1/4 or 1/8 scale while still covering size
    width, height = image.size
    if width < 1 or height < 1:
        raise InputError(f"{name} has no pixels ({width} x {height}); {_READABLE}")
    if width * height > MAX_PIXELS:
        raise InputError(
            f"{name} is {width} x {height} pixels ({width * height / 1e6:.0f} megapixels); images are read up to "
            f"{MAX_PIXELS // 1_000_000} megapixels: scale it down first"
        )


def _reduced(picture: Image.Image, size: int | None) -> Image.Image:
    """``picture`` shrunk by a whole factor while both sides stay at least twice ``size``: the later resize
    then reads a few times fewer pixels and sees the same detail (what Pillow's ``reducing_gap`` does)."""
    if not size:
        return picture
    factor = min(picture.size) // (2 * size)
    return picture.reduce(factor) if factor >= 2 else picture
