//! The user's files as model inputs, prepared as the training data was: PNG or JPEG images
//! (channels checked, downscaled by area averaging when larger, pixels quantised to the data's
//! levels and normalised) and CSV files of raw feature rows. Every failure is an error message
//! naming the problem and the fix; nothing here panics on any input (property-tested below).

use std::io::Cursor;

use image::{imageops, GrayImage, ImageBuffer, ImageFormat, ImageReader, Limits, Pixel, RgbImage};

/// How a classifier's image inputs were made from pixels: `[channels, height, width]`, and
/// `x = (raw / pixel_max − mean[c]) / std[c]` where `raw` is the data's own pixel value
/// (0–16 for the bundled digits, 0–255 for MNIST and CIFAR-10).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageSpec {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub pixel_max: f32,
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

/// Largest image side decoded, and the most memory a decode may allocate.
const MAX_SIDE: u32 = 16_384;
const MAX_DECODE_BYTES: u64 = 512 << 20;

impl ImageSpec {
    pub fn numel(&self) -> usize {
        self.channels * self.height * self.width
    }
    fn shape_text(&self) -> String {
        format!("{}×{}", self.width, self.height)
    }
    fn normalise(&self, channel: usize, raw: f32) -> f32 {
        (raw / self.pixel_max - self.mean[channel]) / self.std[channel]
    }
    /// The data's raw value for an 8-bit pixel, rounded to the data's levels (the digits have
    /// 17: a pixel p becomes round(p·16/255)).
    fn raw_of_pixel(&self, p: u8) -> f32 {
        (p as f32 * self.pixel_max / 255.0).round()
    }
    /// The 8-bit pixel of a model input value (the inverse of the two steps above).
    pub fn pixel_of(&self, channel: usize, x: f32) -> u8 {
        let raw = (x * self.std[channel] + self.mean[channel]) * self.pixel_max;
        (raw * 255.0 / self.pixel_max).round().clamp(0.0, 255.0) as u8
    }
}

/// Decodes a PNG or JPEG file's bytes into one model input ([c, h, w] values, channel
/// planes). `invert` turns dark-on-light drawings into the light-on-dark of the digits and
/// MNIST.
pub fn image_input(bytes: &[u8], spec: &ImageSpec, invert: bool) -> Result<Vec<f32>, String> {
    let format = match image::guess_format(bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg)) => f,
        Ok(other) => {
            return Err(format!(
                "is a {other:?} image; sinter predict reads PNG and JPEG (convert it to PNG)"
            ))
        }
        Err(_) => return Err("is not a PNG or JPEG image (unrecognised file header)".into()),
    };
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| format!("is not a readable {format:?} image ({e}); is the file damaged?"))?;
    let color = img.color();
    if color.has_alpha() && img.to_rgba8().pixels().any(|p| p[3] != 255) {
        return Err("has transparent pixels; flatten it onto a background (no alpha) first".into());
    }
    let kind = if color.has_color() {
        "a colour (RGB)"
    } else {
        "a grayscale"
    };
    match spec.channels {
        1 => {
            let rgb = img.to_rgb8();
            if rgb.pixels().any(|p| p[0] != p[1] || p[1] != p[2]) {
                return Err(format!(
                    "is {kind} image but the model takes grayscale (1-channel) images; convert it to grayscale first"
                ));
            }
            planes(&img.to_luma8(), spec, invert)
        }
        3 if color.has_color() => planes(&img.to_rgb8(), spec, invert),
        3 => Err(format!(
            "is {kind} image but the model takes RGB (3-channel) colour images"
        )),
        c => Err(format!(
            "cannot be fed to this model, which takes {c}-channel images (images have 1 or 3)"
        )),
    }
}

/// Checks the size (downscaling a larger image of the same shape by area averaging, as the
/// digits were made from 32×32 bitmaps) and writes the normalised channel planes.
fn planes<P>(
    img: &ImageBuffer<P, Vec<u8>>,
    spec: &ImageSpec,
    invert: bool,
) -> Result<Vec<f32>, String>
where
    P: Pixel<Subpixel = u8> + 'static,
{
    let (w, h) = (spec.width as u32, spec.height as u32);
    let (iw, ih) = img.dimensions();
    let resized;
    let img = if (iw, ih) == (w, h) {
        img
    } else if iw as u64 * h as u64 != ih as u64 * w as u64 {
        return Err(format!(
            "is {iw}×{ih} but the model takes {} images, a different shape; crop it to that aspect ratio first",
            spec.shape_text()
        ));
    } else if iw < w {
        return Err(format!(
            "is {iw}×{ih}, smaller than the {} images the model takes; use an image of at least that size",
            spec.shape_text()
        ));
    } else {
        resized = imageops::thumbnail(img, w, h);
        &resized
    };
    let hw = spec.height * spec.width;
    let mut out = vec![0f32; spec.numel()];
    for (i, p) in img.pixels().enumerate() {
        for (c, &v) in p.channels().iter().enumerate().take(spec.channels) {
            let v = if invert { 255 - v } else { v };
            out[c * hw + i] = spec.normalise(c, spec.raw_of_pixel(v));
        }
    }
    Ok(out)
}

/// One row of a CSV file: its line number and model input.
#[derive(Debug)]
pub struct CsvRow {
    pub line: usize,
    pub values: Vec<f32>,
}

/// Rows of raw feature values, `c·h·w` per row in channel-plane order (a digits row is the
/// 64 pixel values 0–16 of the bundled CSV, without its label). Blank lines and lines
/// starting with `#` are skipped; a first line that is not numbers is taken as a header.
/// Spreadsheets' variants read too: a UTF-8 byte-order mark, a separator at the end of each
/// line, and `;` (or tab) separators with `,` as the decimal mark.
pub fn csv_rows(text: &str, spec: &ImageSpec) -> Result<Vec<CsvRow>, String> {
    // Excel writes a byte-order mark at the start of a UTF-8 file.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    let mut header: Option<(usize, &str)> = None;
    let mut sep = None;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sep = *sep.get_or_insert_with(|| separator(line));
        let fields = csv_fields(line, sep);
        let numeric = fields.iter().all(|f| number(f).is_some());
        if rows.is_empty() && header.is_none() && !numeric {
            header = Some((line_no, line));
            continue;
        }
        rows.push(CsvRow {
            line: line_no,
            values: csv_row(&fields, spec).map_err(|e| format!("line {line_no}: {e}"))?,
        });
    }
    if rows.is_empty() {
        return Err(match header {
            Some((n, line)) => format!("has no rows of values: its only line (line {n}: {:?}) is not all numbers, so it was read as a header; a row is {} numbers separated by ',' or ';'", shorten(line), spec.numel()),
            None => "has no rows of values (it is empty, or only blank and # lines)".into(),
        });
    }
    Ok(rows)
}

/// The separator of a file, from its first line: `;` or tab where they occur (then `,` is
/// the decimal mark, as in spreadsheets of many locales), else `,`.
fn separator(line: &str) -> char {
    if line.contains(';') {
        ';'
    } else if line.contains('\t') {
        '\t'
    } else {
        ','
    }
}

/// A line's fields, trimmed; one empty field after a final separator is dropped.
fn csv_fields(line: &str, sep: char) -> Vec<&str> {
    let mut fields: Vec<&str> = line.split(sep).map(str::trim).collect();
    if fields.len() > 1 && fields.last() == Some(&"") {
        fields.pop();
    }
    fields
}

/// A field's number: `1.5`, or `1,5` (a decimal comma, in files not separated by commas).
fn number(field: &str) -> Option<f32> {
    field
        .parse()
        .ok()
        .or_else(|| field.replacen(',', ".", 1).parse().ok())
}

/// The start of a long line, for a message.
fn shorten(line: &str) -> String {
    match line.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

fn csv_row(fields: &[&str], spec: &ImageSpec) -> Result<Vec<f32>, String> {
    let n = spec.numel();
    if fields.len() != n {
        return Err(format!(
            "{} values, but the model takes {n} per row ({}×{}×{}){}",
            fields.len(),
            spec.channels,
            spec.height,
            spec.width,
            if fields.len() == n + 1 {
                "; drop the label column"
            } else {
                ""
            }
        ));
    }
    let hw = spec.height * spec.width;
    fields
        .iter()
        .enumerate()
        .map(|(col, f)| {
            let v =
                number(f).ok_or_else(|| format!("column {} is {f:?}, not a number", col + 1))?;
            if !(0.0..=spec.pixel_max).contains(&v) {
                return Err(format!(
                    "column {} is {v}, outside 0–{}, the range of the training data's values",
                    col + 1,
                    spec.pixel_max
                ));
            }
            Ok(spec.normalise(col / hw, v))
        })
        .collect()
}

/// A model input ([c, h, w] values) as an image: what `image_input` reads back exactly.
pub fn to_image(values: &[f32], spec: &ImageSpec) -> image::DynamicImage {
    let (w, h) = (spec.width as u32, spec.height as u32);
    let hw = spec.height * spec.width;
    let px = |c: usize, i: usize| spec.pixel_of(c, values[c * hw + i]);
    if spec.channels == 1 {
        GrayImage::from_fn(w, h, |x, y| image::Luma([px(0, (y * w + x) as usize)])).into()
    } else {
        RgbImage::from_fn(w, h, |x, y| {
            let i = (y * w + x) as usize;
            image::Rgb([px(0, i), px(1, i), px(2, i)])
        })
        .into()
    }
}

/// PNG bytes of an image.
pub fn png_bytes(img: &image::DynamicImage) -> Result<Vec<u8>, String> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png)
        .map_err(|e| format!("cannot encode PNG: {e}"))?;
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn digits() -> ImageSpec {
        ImageSpec {
            channels: 1,
            height: 8,
            width: 8,
            pixel_max: 16.0,
            mean: vec![0.0],
            std: vec![1.0],
        }
    }

    fn cifar_like() -> ImageSpec {
        ImageSpec {
            channels: 3,
            height: 4,
            width: 4,
            pixel_max: 255.0,
            mean: vec![0.4914, 0.4822, 0.4465],
            std: vec![0.2470, 0.2435, 0.2616],
        }
    }

    /// Model inputs made the way the data loaders make them, from raw values.
    fn inputs_from_raw(spec: &ImageSpec, raw: &[u32]) -> Vec<f32> {
        let hw = spec.height * spec.width;
        raw.iter()
            .enumerate()
            .map(|(i, &v)| spec.normalise(i / hw, v as f32))
            .collect()
    }

    fn png(img: image::DynamicImage) -> Vec<u8> {
        png_bytes(&img).unwrap()
    }

    #[test]
    fn an_exported_image_reads_back_to_the_same_input() {
        for spec in [digits(), cifar_like()] {
            let raw: Vec<u32> = (0..spec.numel() as u32)
                .map(|i| (i * 7) % (spec.pixel_max as u32 + 1))
                .collect();
            let x = inputs_from_raw(&spec, &raw);
            let back = image_input(&png(to_image(&x, &spec)), &spec, false).unwrap();
            assert_eq!(back, x, "{spec:?}");
        }
    }

    #[test]
    fn a_larger_drawing_is_area_averaged_like_the_digits_were_made() {
        // The UCI digits count the set pixels of each 4×4 block of a 32×32 bitmap (0–16).
        let counts: Vec<u32> = (0..64).map(|i| (i * 5) % 17).collect();
        let img = GrayImage::from_fn(32, 32, |x, y| {
            let (block, within) = ((y / 4) * 8 + x / 4, (y % 4) * 4 + x % 4);
            image::Luma([if within < counts[block as usize] {
                255
            } else {
                0
            }])
        });
        let got = image_input(&png(img.into()), &digits(), false).unwrap();
        assert_eq!(got, inputs_from_raw(&digits(), &counts));
        // Inverted: dark strokes on white paper give the same input.
        let paper = GrayImage::from_fn(16, 16, |x, y| {
            image::Luma([if (x + y) % 3 == 0 { 0 } else { 255 }])
        });
        let ink = GrayImage::from_fn(16, 16, |x, y| {
            image::Luma([if (x + y) % 3 == 0 { 255 } else { 0 }])
        });
        assert_eq!(
            image_input(&png(paper.into()), &digits(), true).unwrap(),
            image_input(&png(ink.into()), &digits(), false).unwrap()
        );
    }

    #[test]
    fn gray_pixels_stored_as_rgb_are_grayscale_and_jpeg_reads() {
        let gray = GrayImage::from_fn(8, 8, |x, y| image::Luma([(x * 30 + y) as u8]));
        let rgb = image::DynamicImage::from(gray.clone()).to_rgb8();
        assert_eq!(
            image_input(&png(rgb.into()), &digits(), false).unwrap(),
            image_input(&png(gray.clone().into()), &digits(), false).unwrap()
        );
        let mut jpeg = Cursor::new(Vec::new());
        image::DynamicImage::from(gray)
            .write_to(&mut jpeg, ImageFormat::Jpeg)
            .unwrap();
        assert_eq!(
            image_input(jpeg.get_ref(), &digits(), false).unwrap().len(),
            64
        );
    }

    fn error(bytes: &[u8], spec: &ImageSpec) -> String {
        image_input(bytes, spec, false).unwrap_err()
    }

    #[test]
    fn bad_images_get_clear_errors() {
        let colour = RgbImage::from_fn(8, 8, |x, _| image::Rgb([x as u8 * 20, 0, 0]));
        let e = error(&png(colour.into()), &digits());
        assert!(e.contains("colour") && e.contains("grayscale"), "{e}");
        let gray = GrayImage::new(4, 4);
        let e = error(&png(gray.into()), &cifar_like());
        assert!(e.contains("grayscale image") && e.contains("RGB"), "{e}");
        let e = error(&png(GrayImage::new(16, 8).into()), &digits());
        assert!(
            e.contains("16×8") && e.contains("8×8") && e.contains("aspect"),
            "{e}"
        );
        let e = error(&png(GrayImage::new(4, 4).into()), &digits());
        assert!(e.contains("smaller"), "{e}");
        let mut see_through = image::RgbaImage::new(8, 8);
        see_through.put_pixel(3, 3, image::Rgba([9, 9, 9, 100]));
        let e = error(&png(see_through.into()), &digits());
        assert!(e.contains("transparent"), "{e}");
        let e = error(b"not an image at all", &digits());
        assert!(e.contains("not a PNG or JPEG"), "{e}");
        let e = error(b"GIF89a\x01\x00\x01\x00", &digits());
        assert!(e.contains("Gif") && e.contains("PNG"), "{e}");
        let good = png(GrayImage::new(8, 8).into());
        let e = error(&good[..good.len() / 2], &digits());
        assert!(e.contains("damaged"), "{e}");
    }

    #[test]
    fn csv_rows_are_checked_and_normalised() {
        let spec = digits();
        let row: Vec<String> = (0..64).map(|i| (i % 17).to_string()).collect();
        let text = format!(
            "# a comment\np{}\n\n{}\n",
            (0..64).map(|i| format!(",p{i}")).collect::<String>(),
            row.join(",")
        );
        let rows = csv_rows(&text, &spec).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].line, 4);
        let raw: Vec<u32> = (0..64).map(|i| i % 17).collect();
        assert_eq!(rows[0].values, inputs_from_raw(&spec, &raw));
        let e = csv_rows(&format!("{},3", row.join(",")), &spec)
            .err()
            .unwrap();
        assert!(e.contains("65 values") && e.contains("label"), "{e}");
        let e = csv_rows(
            &format!("{}\n{},17", row.join(","), row[..63].join(",")),
            &spec,
        )
        .err()
        .unwrap();
        assert!(
            e.contains("line 2") && e.contains("column 64") && e.contains("outside 0–16"),
            "{e}"
        );
        let e = csv_rows(
            &format!(
                "{}\nx{}",
                row.join(","),
                row[1..].iter().map(|v| format!(",{v}")).collect::<String>()
            ),
            &spec,
        )
        .err()
        .unwrap();
        assert!(e.contains("line 2") && e.contains("\"x\""), "{e}");
        assert!(csv_rows("# nothing\n\n", &spec)
            .unwrap_err()
            .contains("no rows"));
    }

    #[test]
    fn spreadsheet_csv_variants_read_as_plain_rows() {
        let spec = digits();
        let row: Vec<String> = (0..64).map(|i| (i % 17).to_string()).collect();
        let plain = csv_rows(&row.join(","), &spec).unwrap()[0].values.clone();
        for text in [
            format!("\u{feff}{}\r\n", row.join(",")),
            format!("{},", row.join(",")),
            format!("{};", row.join(";")),
            format!("{}\t", row.join("\t")),
        ] {
            let rows = csv_rows(&text, &spec).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(rows[0].values, plain, "{text:?}");
        }
        // `;` files of comma-decimal locales: 7,5 is 7.5.
        let comma: Vec<String> = (0..64).map(|i| format!("{},5", i % 16)).collect();
        let dot: Vec<String> = (0..64).map(|i| format!("{}.5", i % 16)).collect();
        assert_eq!(
            csv_rows(&comma.join(";"), &spec).unwrap()[0].values,
            csv_rows(&dot.join(","), &spec).unwrap()[0].values
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_bytes_give_an_input_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = image_input(&bytes, &digits(), false);
        }

        #[test]
        fn damaged_images_give_an_input_or_an_error(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<usize>(),
            jpeg in any::<bool>(),
        ) {
            let img = image::DynamicImage::from(RgbImage::from_fn(12, 12, |x, y| image::Rgb([x as u8 * 9, y as u8 * 7, 3])));
            let mut bytes = Cursor::new(Vec::new());
            img.write_to(&mut bytes, if jpeg { ImageFormat::Jpeg } else { ImageFormat::Png }).unwrap();
            let mut bytes = bytes.into_inner();
            for (at, v) in edits {
                let i = at % bytes.len();
                bytes[i] = v;
            }
            bytes.truncate(1 + cut % bytes.len());
            for spec in [digits(), cifar_like()] {
                let _ = image_input(&bytes, &spec, false);
            }
        }

        #[test]
        fn any_text_gives_rows_or_an_error(text in "[0-9a-z.,#\\-\n ]{0,400}") {
            let _ = csv_rows(&text, &digits());
        }
    }
}
