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
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Field(path) => write!(f, "status.{path}"),
            Item::Condition(ty) => write!(f, "condition {ty}"),
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
