//! What an ownership document assigns, and a change to it by someone else.

use std::fmt;

use super::FieldPath;

/// An owned item of the status.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Item {
    /// A field path below `.status`.
    Field(FieldPath),
    /// A condition type.
    Condition(String),
    /// The entries of a keyed list whose member `key` has the string value
    /// `value`: all of them together are one item.
    Entry {
        /// The list's path below `.status`.
        list: FieldPath,
        /// The member of each entry that names its owner.
        key: String,
        /// The owner's key value (opaque: any character may appear).
        value: String,
    },
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Field(path) => write!(f, "status.{path}"),
            Item::Condition(ty) => write!(f, "condition {ty}"),
            // The value as a JSON string: a controllerName may hold `=`, `,`,
            // `;`, `:`, `'` or `]`, and quoted it can never be misread.
            Item::Entry { list, key, value } => {
                write!(f, "status.{list}[{key}={}]", serde_json::Value::from(value.as_str()))
            }
        }
    }
}

/// A change by a writer to an `item` that `owner` owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// What was changed.
    pub item: Item,
    /// Who owns it.
    pub owner: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (owned by {})", self.item, self.owner)
    }
}
