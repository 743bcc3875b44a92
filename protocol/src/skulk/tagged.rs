//! The two serde shapes every Skulk union uses.
//!
//! - [`tagged_union!`]: an externally tagged single-key object `{"<Tag>": {…}}` (Skulk's
//!   `TaggedModel`). A tag den does not know is kept as `Unknown { tag, value }`: it is
//!   evidence of something newer, never a parse error.
//! - [`open_enum!`]: a string enum (`"Pending"`, `"Pipeline"`, …) whose unknown values are
//!   kept as `Other(String)`.

use serde::Deserialize;
use serde::de::Error as _;
use serde_json::Value;

/// Reads one externally tagged object and returns its tag and inner value.
///
/// `what` names the union in the error message, e.g. "RunnerStatus".
pub(crate) fn split_tagged<'de, D>(deserializer: D, what: &str) -> Result<(String, Value), D::Error>
where
    D: serde::Deserializer<'de>,
{
    let value = Value::deserialize(deserializer)?;
    match value {
        Value::Object(map) if map.len() == 1 => {
            // The guard above guarantees exactly one entry.
            match map.into_iter().next() {
                Some((tag, inner)) => Ok((tag, inner)),
                None => Err(D::Error::custom(format!("{what}: empty tagged object"))),
            }
        }
        Value::Object(map) => Err(D::Error::custom(format!(
            "{what}: expected a single-key object {{\"<Variant>\": {{…}}}}, got an object with {} keys",
            map.len()
        ))),
        other => Err(D::Error::custom(format!(
            "{what}: expected a single-key object {{\"<Variant>\": {{…}}}}, got {}",
            json_kind(&other)
        ))),
    }
}

/// A short name for a JSON value's kind, for error messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Declares an externally tagged union with an `Unknown { tag, value }` fallback.
///
/// ```ignore
/// tagged_union! {
///     /// doc
///     pub enum RunnerStatus {
///         Ready(NoFields) = "RunnerReady",
///     }
/// }
/// ```
macro_rules! tagged_union {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident($ty:ty) = $tag:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        // These are wire records read once and inspected; boxing variants would only make
        // every match clumsier.
        #[allow(clippy::large_enum_variant)]
        pub enum $name {
            $( $(#[$vmeta])* $variant($ty), )+
            /// A variant this version of den does not know, kept verbatim as evidence.
            Unknown {
                tag: String,
                value: serde_json::Value,
            },
        }

        impl $name {
            /// The wire tag, e.g. `"RunnerReady"`.
            pub fn tag(&self) -> &str {
                match self {
                    $( Self::$variant(_) => $tag, )+
                    Self::Unknown { tag, .. } => tag,
                }
            }

            /// Whether this is a variant den does not know.
            pub fn is_unknown(&self) -> bool {
                matches!(self, Self::Unknown { .. })
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(Some(1))?;
                match self {
                    $( Self::$variant(inner) => map.serialize_entry($tag, inner)?, )+
                    Self::Unknown { tag, value } => map.serialize_entry(tag, value)?,
                }
                map.end()
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let (tag, value) =
                    $crate::skulk::tagged::split_tagged(deserializer, stringify!($name))?;
                match tag.as_str() {
                    $( $tag => serde_json::from_value(value).map(Self::$variant).map_err(|e| {
                        <D::Error as serde::de::Error>::custom(format!(
                            "{} {}: {}", stringify!($name), $tag, e
                        ))
                    }), )+
                    _ => Ok(Self::Unknown { tag, value }),
                }
            }
        }
    };
}
pub(crate) use tagged_union;

/// Declares a string enum with an `Other(String)` fallback.
macro_rules! open_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version of den does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $text, )+
                    Self::Other(text) => text,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                match text {
                    $( $text => Self::$variant, )+
                    other => Self::Other(other.to_owned()),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(deserializer)?;
                Ok(Self::from(text.as_str()))
            }
        }
    };
}
pub(crate) use open_enum;

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Inner {
        x: u32,
    }

    tagged_union! {
        /// test union
        pub enum Demo {
            A(Inner) = "A",
        }
    }

    open_enum! {
        /// test enum
        pub enum Colour {
            Red = "red",
        }
    }

    #[test]
    fn known_and_unknown_tags_round_trip() {
        let a: Demo = serde_json::from_value(json!({"A": {"x": 3}})).unwrap();
        assert_eq!(a, Demo::A(Inner { x: 3 }));
        let b: Demo = serde_json::from_value(json!({"B": {"y": 1}})).unwrap();
        assert_eq!(b.tag(), "B");
        assert!(b.is_unknown());
        assert_eq!(serde_json::to_value(&b).unwrap(), json!({"B": {"y": 1}}));
        assert_eq!(serde_json::to_value(&a).unwrap(), json!({"A": {"x": 3}}));
    }

    #[test]
    fn malformed_tagged_objects_are_errors_that_say_why() {
        let err = serde_json::from_value::<Demo>(json!({"A": {}, "B": {}})).unwrap_err();
        assert!(err.to_string().contains("single-key"), "{err}");
        let err = serde_json::from_value::<Demo>(json!("A")).unwrap_err();
        assert!(err.to_string().contains("a string"), "{err}");
    }

    #[test]
    fn open_enums_keep_unknown_values() {
        let c: Colour = serde_json::from_value(json!("blue")).unwrap();
        assert_eq!(c, Colour::Other("blue".into()));
        assert_eq!(serde_json::to_value(&c).unwrap(), json!("blue"));
        assert_eq!(
            serde_json::from_value::<Colour>(json!("red")).unwrap(),
            Colour::Red
        );
    }
}
