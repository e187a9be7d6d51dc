//! Kubernetes resource quantities ("500m", "2", "256Mi", "1G").
//!
//! The maintained quantity crates all pull in k8s-openapi, which must stay out
//! of the agent, so the small grammar of
//! `k8s.io/apimachinery/pkg/api/resource` is parsed here: a decimal number,
//! an optional exponent (`e3`), and a binary (`Ki`..`Ei`) or decimal
//! (`n`, `u`, `m`, `k`, `M`..`E`) suffix.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize};

/// Why a quantity was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason} (expected e.g. \"500m\", \"2\", \"256Mi\", \"1G\")")]
pub struct QuantityError {
    /// The text that was given.
    pub input: String,
    /// What was wrong with it.
    pub reason: String,
}

/// A quantity as written in a spec (kept verbatim, parsed on use).
///
/// Accepts a JSON number too, as Kubernetes does (`cpu: 2` in YAML).
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
            Float(f64),
        }
        Ok(match Raw::deserialize(deserializer)? {
            Raw::Text(s) => Quantity(s),
            Raw::Int(i) => Quantity(i.to_string()),
            Raw::Float(f) => Quantity(f.to_string()),
        })
    }
}

impl Quantity {
    /// The value in thousandths of a unit, rounded up (CPU: millicores).
    pub fn to_milli(&self) -> Result<u64, QuantityError> {
        scaled(&self.0, 3)
    }

    /// The value in whole units, rounded up (memory: bytes).
    pub fn to_units(&self) -> Result<u64, QuantityError> {
        scaled(&self.0, 0)
    }

    /// A CPU quantity from millicores ("1500m").
    pub fn from_millicores(milli: u64) -> Self {
        if milli % 1000 == 0 {
            Self((milli / 1000).to_string())
        } else {
            Self(format!("{milli}m"))
        }
    }

    /// A memory quantity from bytes, in the largest exact binary unit.
    pub fn from_bytes(bytes: u64) -> Self {
        const UNITS: [(&str, u64); 4] = [("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
        for (suffix, size) in UNITS {
            if bytes >= size && bytes % size == 0 {
                return Self(format!("{}{suffix}", bytes / size));
            }
        }
        Self(bytes.to_string())
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Quantity {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // The same shape as k8s.io/apimachinery's Quantity in a CRD schema.
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "description": "A Kubernetes quantity such as \"500m\", \"2\" or \"256Mi\"."
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// Parses `input` and returns its value times 10^`decimals`, rounded up.
fn scaled(input: &str, decimals: i32) -> Result<u64, QuantityError> {
    let err = |reason: &str| QuantityError {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.starts_with('-') {
        return Err(err("must not be negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(err("no number"));
    }
    // (multiplier as 2^bin * 10^dec)
    let (binary_exp, decimal_exp): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        other => {
            let exp = other
                .strip_prefix(['e', 'E'])
                .and_then(|e| e.parse::<i32>().ok())
                .ok_or_else(|| err(&format!("unknown suffix {other:?}")))?;
            (0, exp)
        }
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{int_part}{frac_part}");
    let exponent = decimal_exp + decimals - frac_part.len() as i32;
    let mantissa: u128 = digits
        .trim_start_matches('0')
        .parse::<u128>()
        .or_else(|_| {
            if digits.chars().all(|c| c == '0') {
                Ok(0)
            } else {
                Err(())
            }
        })
        .map_err(|_| err("number too large"))?;
    let value = mantissa
        .checked_mul(1u128 << binary_exp)
        .ok_or_else(|| err("number too large"))?;
    let value = if exponent >= 0 {
        10u128
            .checked_pow(exponent as u32)
            .and_then(|p| value.checked_mul(p))
            .ok_or_else(|| err("number too large"))?
    } else {
        let divisor = 10u128
            .checked_pow(exponent.unsigned_abs())
            .ok_or_else(|| err("exponent too small"))?;
        value.div_ceil(divisor)
    };
    u64::try_from(value).map_err(|_| err("number too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::from(s)
    }

    #[test]
    fn cpu_in_millicores() {
        assert_eq!(q("500m").to_milli().unwrap(), 500);
        assert_eq!(q("2").to_milli().unwrap(), 2000);
        assert_eq!(q("0.5").to_milli().unwrap(), 500);
        assert_eq!(q("1.25").to_milli().unwrap(), 1250);
        assert_eq!(q("100u").to_milli().unwrap(), 1, "rounds up");
    }

    #[test]
    fn memory_in_bytes() {
        assert_eq!(q("256Mi").to_units().unwrap(), 256 << 20);
        assert_eq!(q("1G").to_units().unwrap(), 1_000_000_000);
        assert_eq!(q("1.5Gi").to_units().unwrap(), 3 << 29);
        assert_eq!(q("128974848").to_units().unwrap(), 128_974_848);
        assert_eq!(q("129e6").to_units().unwrap(), 129_000_000);
        assert_eq!(q("1k").to_units().unwrap(), 1000);
    }

    #[test]
    fn refuses_bad_quantities() {
        for bad in ["", "-1", "abc", "1.2.3", "5Xi", "1e999"] {
            let e = q(bad).to_units().unwrap_err();
            assert!(e.to_string().contains("invalid quantity"), "{bad}: {e}");
        }
    }

    #[test]
    fn accepts_json_numbers() {
        let v: Quantity = serde_json::from_str("2").unwrap();
        assert_eq!(v.to_milli().unwrap(), 2000);
        let v: Quantity = serde_json::from_str("0.5").unwrap();
        assert_eq!(v.to_milli().unwrap(), 500);
    }

    #[test]
    fn formats_from_numbers() {
        assert_eq!(Quantity::from_millicores(1500).as_str(), "1500m");
        assert_eq!(Quantity::from_millicores(4000).as_str(), "4");
        assert_eq!(Quantity::from_bytes(8 << 30).as_str(), "8Gi");
        assert_eq!(Quantity::from_bytes(1000).as_str(), "1000");
    }
}
