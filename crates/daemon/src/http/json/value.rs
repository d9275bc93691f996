//! The two passes of a body: the text into a `Value`, refusing a member given twice
//! ([`strict_value`]); the `Value` into the input type with a typed error ([`ValueDeserializer`]).

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::{Map, Value};

use super::{BodyError, BodyRejection};

/// The body as a `Value`, refusing a member given twice.
pub(super) fn strict_value(body: &[u8]) -> Result<Value, BodyRejection> {
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = Strict {
        duplicate: &duplicate,
        path: String::new(),
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    match (parsed, duplicate.into_inner()) {
        (_, Some(path)) => Err(BodyRejection {
            error: BodyError::Duplicate(path.clone()),
            field: Some(path),
        }),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(BodyRejection {
            error: BodyError::Syntax(e.to_string()),
            field: None,
        }),
    }
}

/// A `Value` seed that notes the path of the first member given twice.
struct Strict<'a> {
    duplicate: &'a RefCell<Option<String>>,
    path: String,
}

impl<'a> Strict<'a> {
    fn at(&self, path: String) -> Strict<'a> {
        Strict {
            duplicate: self.duplicate,
            path,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) =
            seq.next_element_seed(self.at(format!("{}[{}]", self.path, out.len())))?
        {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            if out.contains_key(&key) {
                *self.duplicate.borrow_mut() = Some(path);
                return Err(de::Error::custom("a member is given twice"));
            }
            let v = map.next_value_seed(self.at(path))?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// A `serde_json::Value` as a deserializer with the error type `E` (serde_json's own has its
/// fixed error type, whose details exist only as text).
pub struct ValueDeserializer<E> {
    value: Value,
    error: PhantomData<E>,
}

impl<E> ValueDeserializer<E> {
    pub fn new(value: Value) -> Self {
        ValueDeserializer {
            value,
            error: PhantomData,
        }
    }
}

impl<'de, E: de::Error> IntoDeserializer<'de, E> for ValueDeserializer<E> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de, E: de::Error> de::Deserializer<'de> for ValueDeserializer<E> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => visitor.visit_u64(u),
                (None, Some(i), _) => visitor.visit_i64(i),
                (None, None, Some(f)) => visitor.visit_f64(f),
                (None, None, None) => {
                    Err(E::invalid_type(de::Unexpected::Other("number"), &visitor))
                }
            },
            Value::String(s) => visitor.visit_string(s),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter().map(ValueDeserializer::new));
                let v = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(v)
            }
            Value::Object(members) => {
                let mut map = MapDeserializer::new(
                    members
                        .into_iter()
                        .map(|(k, v)| (k, ValueDeserializer::new(v))),
                );
                let v = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(v)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, E> {
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}
