//! [`BodyError`]: why a body does not fit, as the values serde hands a [`de::Error`].

use std::fmt;

use serde::de;

/// Why a JSON body does not fit the input type. Never holds a value from the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Not JSON (serde_json's syntax error: it names a line and column, never the text).
    Syntax(String),
    /// A member given twice (its path).
    Duplicate(String),
    /// A value of the wrong JSON type; what was expected.
    InvalidType {
        expected: String,
    },
    /// A value of the right type out of range; what was expected.
    InvalidValue {
        expected: String,
    },
    /// An array or tuple of the wrong length.
    InvalidLength {
        len: usize,
        expected: String,
    },
    /// A member the type does not have; the members it has.
    UnknownField {
        name: String,
        expected: &'static [&'static str],
    },
    UnknownVariant {
        expected: &'static [&'static str],
    },
    /// A required member left out (its name).
    MissingField(&'static str),
    /// A member given twice, as the input type saw it.
    DuplicateField(&'static str),
    /// Any other refusal of a `Deserialize` implementation (its own text).
    Other(String),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::Syntax(e) => write!(f, "{e}"),
            BodyError::Duplicate(path) => write!(f, "member {path} is given twice"),
            BodyError::InvalidType { expected } => write!(f, "invalid type: expected {expected}"),
            BodyError::InvalidValue { expected } => {
                write!(f, "invalid value: expected {expected}")
            }
            BodyError::InvalidLength { len, expected } => {
                write!(f, "invalid length {len}: expected {expected}")
            }
            BodyError::UnknownField { name, expected } => {
                write!(f, "unknown field `{name}`, expected {}", one_of(expected))
            }
            BodyError::UnknownVariant { expected } => {
                write!(f, "unknown variant, expected {}", one_of(expected))
            }
            BodyError::MissingField(name) => write!(f, "missing field `{name}`"),
            BodyError::DuplicateField(name) => write!(f, "duplicate field `{name}`"),
            BodyError::Other(text) => f.write_str(text),
        }
    }
}

fn one_of(names: &[&str]) -> String {
    match names {
        [] => "nothing".into(),
        [one] => format!("`{one}`"),
        _ => {
            let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("one of {}", quoted.join(", "))
        }
    }
}

impl std::error::Error for BodyError {}

impl de::Error for BodyError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        BodyError::Other(msg.to_string())
    }

    fn invalid_type(_unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        BodyError::InvalidType {
            expected: exp.to_string(),
        }
    }

    fn invalid_value(_unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        BodyError::InvalidValue {
            expected: exp.to_string(),
        }
    }

    fn invalid_length(len: usize, exp: &dyn de::Expected) -> Self {
        BodyError::InvalidLength {
            len,
            expected: exp.to_string(),
        }
    }

    fn unknown_variant(_variant: &str, expected: &'static [&'static str]) -> Self {
        BodyError::UnknownVariant { expected }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        BodyError::UnknownField {
            name: field.to_string(),
            expected,
        }
    }

    fn missing_field(field: &'static str) -> Self {
        BodyError::MissingField(field)
    }

    fn duplicate_field(field: &'static str) -> Self {
        BodyError::DuplicateField(field)
    }
}
