//! Dot paths below `.status`, as the ownership document writes them.

use std::fmt;

use jsonptr::PointerBuf;
use serde_json::Value;

/// A syntax error in a dot path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path is empty")]
    Empty,
    #[error("path {0:?} has an empty segment (a leading, trailing or doubled dot)")]
    EmptySegment(String),
}

/// A dot-separated path of JSON object keys below `.status`, e.g. `summary.ready`.
///
/// A segment may hold any character but `.`, including `/` and `~`, which are
/// escaped per RFC 6901 only when the path becomes a JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    pub fn parse(text: &str) -> Result<Self, PathError> {
        if text.is_empty() {
            return Err(PathError::Empty);
        }
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(PathError::EmptySegment(text.to_owned()));
        }
        Ok(Self(segments))
    }

    /// A one-segment path; `segment` must be non-empty and hold no dot.
    pub(crate) fn single(segment: &str) -> Self {
        Self(vec![segment.to_owned()])
    }

    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// True when `self` equals `other` or lies below it.
    pub fn is_within(&self, other: &FieldPath) -> bool {
        self.0.len() >= other.0.len() && self.0[..other.0.len()] == other.0[..]
    }

    /// True when one of the two paths equals or lies below the other.
    pub fn overlaps(&self, other: &FieldPath) -> bool {
        self.is_within(other) || other.is_within(self)
    }

    /// The JSON Pointer of this path inside a whole object: `/status/<segments>`.
    pub fn status_pointer(&self) -> PointerBuf {
        status_pointer(&self.0)
    }

    /// The value at this path below `status`; `None` when it or a parent is
    /// absent, `null`, or a parent is not an object. Absent and `null` are
    /// the same to ownership.
    pub fn get<'a>(&self, status: Option<&'a Value>) -> Option<&'a Value> {
        value_at(status, &self.0)
    }
}

/// The non-null value at `segments` below `status`, walking objects only.
pub(crate) fn value_at<'a, S: AsRef<str>>(status: Option<&'a Value>, segments: &[S]) -> Option<&'a Value> {
    let mut current = status?;
    for segment in segments {
        current = current.as_object()?.get(segment.as_ref())?;
    }
    (!current.is_null()).then_some(current)
}

/// `/status` followed by `segments`, each escaped per RFC 6901.
pub(crate) fn status_pointer<S: AsRef<str>>(segments: &[S]) -> PointerBuf {
    let mut pointer = PointerBuf::from_tokens(["status"]);
    for segment in segments {
        pointer.push_back(segment.as_ref());
    }
    pointer
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_dot_paths_and_rejects_empty_segments() {
        assert_eq!(FieldPath::parse("a.b").unwrap().segments(), ["a", "b"]);
        assert_eq!(FieldPath::parse("a/b~c").unwrap().segments(), ["a/b~c"]);
        assert_eq!(FieldPath::parse(""), Err(PathError::Empty));
        for bad in [".a", "a.", "a..b", "."] {
            assert!(
                matches!(FieldPath::parse(bad), Err(PathError::EmptySegment(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn pointers_escape_slash_and_tilde() {
        let path = FieldPath::parse("a/b.c~d").unwrap();
        assert_eq!(path.status_pointer().as_str(), "/status/a~1b/c~0d");
    }

    #[test]
    fn overlap_is_prefix_by_segment_not_by_text() {
        let p = |s| FieldPath::parse(s).unwrap();
        assert!(p("a.b").is_within(&p("a")));
        assert!(p("a").overlaps(&p("a.b")));
        assert!(!p("ab").overlaps(&p("a")));
        assert!(!p("a.c").overlaps(&p("a.b")));
    }

    #[test]
    fn get_treats_null_and_non_object_parents_as_absent() {
        let status = json!({"a": {"b": 1, "n": null}, "s": "x"});
        let p = |s| FieldPath::parse(s).unwrap();
        assert_eq!(p("a.b").get(Some(&status)), Some(&json!(1)));
        assert_eq!(p("a.n").get(Some(&status)), None);
        assert_eq!(p("s.x").get(Some(&status)), None);
        assert_eq!(p("a.b").get(None), None);
    }
}
