//! [`Size`]: a pattern size of the indexer (`sink_size`, `window_size`, `heavy_size`)
//! given either as a count of positions or as a ratio of the sequence length (spec
//! `spec/pqcache-indexer.md`, "Sizes given as ratios").
//!
//! A ratio is resolved at each step with that step's `S` ([`Size::resolve`]): a decode
//! loop's `S` grows by one every step, and each entry of a ragged batch has its own.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// What a size may be, for error messages.
pub const SIZE_EXPECTED: &str = "a count (an unsigned integer such as 128) or a ratio of \
     the sequence length in [0, 1] written with a decimal point (0.1 means floor(0.1 * S) \
     at each step)";

/// A size given as a count of positions or as a fraction of the sequence length `S`
/// (spec "Sizes given as ratios"; upstream takes an `int` or a `float` the same way).
///
/// Written out (files, flags, [`fmt::Display`], serde strings), a value with a decimal
/// point or an exponent (`0.1`, `1.0`, `0.0`, `5e-2`) is a ratio and a plain unsigned
/// integer (`128`, `0`) a count, so files that hold integers keep their meaning.
///
/// Equality and hashing compare a ratio's bits: `Ratio(0.1)` equals itself only, and
/// `Count(0)` differs from `Ratio(0.0)` although both resolve to 0.
#[derive(Debug, Clone, Copy)]
pub enum Size {
    /// Exactly this many positions at every step.
    Count(usize),
    /// `floor(value * S)` positions at a step of sequence length `S`; `value` in
    /// `[0, 1]` (checked by [`Size::ratio`], [`Size::check`] and config validation).
    Ratio(f64),
}

impl Size {
    /// A checked ratio: `value` must be finite and in `[0, 1]` (1.0 included; `-0.0`
    /// counts as negative).
    ///
    /// # Errors
    ///
    /// [`Error::PqConfig`] naming `field`, the value and what is allowed: NaN, a
    /// negative value, a value above 1.0 (infinities included).
    pub fn ratio(field: &'static str, value: f64) -> Result<Size> {
        let why = if value.is_nan() {
            "NaN is not a size"
        } else if value.is_sign_negative() {
            "a negative size"
        } else if value > 1.0 {
            "a ratio above 1.0 (a count is written without a decimal point: 2, not 2.0)"
        } else {
            return Ok(Size::Ratio(value));
        };
        Err(Error::PqConfig {
            field,
            value: format!("{value:?}"),
            expected: format!("{SIZE_EXPECTED}; got {why}"),
        })
    }

    /// Parse a size as files and flags write it: a plain unsigned integer (an optional
    /// `+`, then digits) is a [`Size::Count`]; a number with a decimal point or an
    /// exponent is a [`Size::Ratio`] (checked as [`Size::ratio`]). Surrounding
    /// whitespace is ignored.
    ///
    /// # Errors
    ///
    /// [`Error::PqConfig`] naming `field`, the text and what is allowed: an empty or
    /// non-numeric string (`nan` and `inf` included), a negative value, a count too
    /// large for `usize`, a ratio NaN, negative or above 1.0.
    pub fn parse_field(field: &'static str, text: &str) -> Result<Size> {
        let t = text.trim();
        let shown = if t.is_empty() { "\"\"" } else { t };
        let fail = |why: &str| {
            Err(Error::PqConfig {
                field,
                value: shown.to_string(),
                expected: format!("{SIZE_EXPECTED}; got {why}"),
            })
        };
        let digits = t.strip_prefix('+').unwrap_or(t);
        if t.is_empty() {
            return fail("an empty value");
        }
        if t.starts_with('-') {
            return fail("a negative size");
        }
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return match digits.parse::<usize>() {
                Ok(n) => Ok(Size::Count(n)),
                Err(_) => fail("a count too large for this machine's usize"),
            };
        }
        let decimal = t.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'));
        match t.parse::<f64>() {
            Ok(v) if decimal && v.is_finite() => Size::ratio(field, v).map_err(|e| match e {
                Error::PqConfig { expected, .. } => Error::PqConfig {
                    field,
                    value: shown.to_string(),
                    expected,
                },
                other => other,
            }),
            _ => fail("something that is not a number"),
        }
    }

    /// The count this size means at a step of sequence length `s`: a count itself, a
    /// ratio `floor(value * s)`.
    ///
    /// The product is the IEEE double product of `value` and `s` (exact for `s <=
    /// 2^53`), truncated, which is what upstream's Python `int(value * S)` computes, so
    /// both pick the same size bit for bit: `0.1` at `S = 32768` gives 3276, `0.1 -
    /// 256/32768` (= 0.0921875) gives 3020. Never more than `s`; an out-of-range ratio
    /// (which validation refuses) resolves into `0..=s` instead of panicking.
    pub fn resolve(self, s: usize) -> usize {
        match self {
            Size::Count(n) => n,
            Size::Ratio(r) => {
                let x = r * s as f64;
                if x >= 0.0 {
                    // `as` saturates; the min keeps a ratio above 1.0 inside the sequence
                    (x.floor() as usize).min(s)
                } else {
                    0 // negative or NaN: refused by validation
                }
            }
        }
    }

    /// Whether this size is a ratio (its count depends on `S`).
    pub fn is_ratio(self) -> bool {
        matches!(self, Size::Ratio(_))
    }

    /// Check this size for `field`: a ratio must be in `[0, 1]` (see [`Size::ratio`]);
    /// a count passes.
    ///
    /// # Errors
    ///
    /// As [`Size::ratio`].
    pub fn check(self, field: &'static str) -> Result<()> {
        match self {
            Size::Count(_) => Ok(()),
            Size::Ratio(r) => Size::ratio(field, r).map(|_| ()),
        }
    }
}

impl From<usize> for Size {
    /// A count.
    fn from(n: usize) -> Self {
        Size::Count(n)
    }
}

impl PartialEq for Size {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Size::Count(a), Size::Count(b)) => a == b,
            (Size::Ratio(a), Size::Ratio(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for Size {}

impl Hash for Size {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            Size::Count(n) => {
                0u8.hash(state);
                n.hash(state);
            }
            Size::Ratio(r) => {
                1u8.hash(state);
                r.to_bits().hash(state);
            }
        }
    }
}

impl fmt::Display for Size {
    /// A count as its integer (`128`), a ratio as the shortest text that parses back to
    /// the same bits, always with a decimal point or an exponent (`0.1`, `1.0`, `1e-7`),
    /// so [`Size::parse_field`] reads back the same size.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Size::Count(n) => write!(f, "{n}"),
            Size::Ratio(r) => write!(f, "{r:?}"),
        }
    }
}

impl FromStr for Size {
    type Err = Error;
    /// [`Size::parse_field`] with the field named `size`.
    fn from_str(s: &str) -> Result<Self> {
        Size::parse_field("size", s)
    }
}

impl Serialize for Size {
    /// A count as an unsigned integer, a ratio as a float (JSON: `128`, `0.1`, `1.0`).
    fn serialize<S: Serializer>(&self, ser: S) -> std::result::Result<S::Ok, S::Error> {
        match *self {
            Size::Count(n) => ser.serialize_u64(n as u64),
            Size::Ratio(r) => ser.serialize_f64(r),
        }
    }
}

impl<'de> Deserialize<'de> for Size {
    /// An unsigned integer (a count), a float (a ratio, checked), or a string as
    /// [`Size::parse_field`] reads it (`"128"`, `"0.1"`).
    fn deserialize<D: Deserializer<'de>>(de: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(SIZE_EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Size, E> {
                usize::try_from(v)
                    .map(Size::Count)
                    .map_err(|_| E::custom(format!("size {v} too large for usize")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Size, E> {
                u64::try_from(v)
                    .map_err(|_| {
                        E::custom(format!(
                            "size {v}: a negative size; expected {SIZE_EXPECTED}"
                        ))
                    })
                    .and_then(|u| self.visit_u64(u))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Size, E> {
                Size::ratio("size", v).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Size, E> {
                Size::parse_field("size", v).map_err(E::custom)
            }
        }
        de.deserialize_any(V)
    }
}
