//! CEL text for the ownership rules: where an owned item is in a status, and
//! whether it changed, with the webhook's notion of "the same value".
//!
//! CEL has no recursion and no user functions, so the webhook's
//! [`same_value`](crate::ownership::same_value) (absent and `null` alike at
//! every depth, numbers by the text the API server writes for them, lists
//! item by item) is unrolled to [`NULL_DEPTH`] levels inside an owned value;
//! below that the comparison is CEL's `==`, for which a `null` member
//! differs from an absent one. Each value is bound to a name once per level,
//! so the text grows as `2^NULL_DEPTH`, not as the depth of the value.

use crate::ownership::FieldPath;

/// How many levels inside an owned value the policies compare `null` and
/// absent members alike, and numbers by value and text: a Gateway API
/// `parents` entry (entry, its `conditions`, a condition, its members) is four.
pub const NULL_DEPTH: usize = 4;

/// A CEL string literal. CEL reads JSON's escapes, and serde_json writes
/// every other character as it is (CEL accepts UTF-8 in literals).
pub fn string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// A CEL list literal of strings.
pub fn string_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(string).collect();
    format!("[{}]", items.join(", "))
}

/// The value at `path` below `status` (an expression giving the status or
/// `null`), or `null` where a segment is missing or its parent is not an
/// object, as the webhook reads a path. Optional indexing alone would fail
/// on a list (cel-go indexes a list by a string with an error, not `none`),
/// so each step looks at its parent's type first.
pub fn value_at(status: &str, segments: &[String]) -> String {
    // `dyn`: else the checker types the value as `null`, from `orValue(null)`.
    let mut text = status.to_owned();
    for segment in segments {
        text = bind_value(
            "pv",
            &text,
            &format!("type(pv) == map ? dyn(pv[?{}].orValue(null)) : null", string(segment)),
        );
    }
    format!("dyn({text})")
}

/// The list at `path` below `status`, or `[]` when it is missing or not a
/// list, as the webhook reads a conditions or keyed list.
pub fn list_at(status: &str, path: &FieldPath) -> String {
    let value = value_at(status, path.segments());
    bind_value("l", &value, "type(l) == list ? l : []")
}

/// Whether `a` and `b` (expressions) are the same value as the webhook sees
/// it, unrolled to [`NULL_DEPTH`] levels.
pub fn same(a: &str, b: &str) -> String {
    same_at(NULL_DEPTH, a, b, 0)
}

fn same_at(depth: usize, a: &str, b: &str, level: usize) -> String {
    // Numbers as the webhook sees them: the API server writes a whole
    // double (`1.0` from a client) as `1`, so an int and a double of the
    // same value are the same. CEL's `==` also holds
    // `9007199254740993 == 9007199254740992.0`, whose texts differ: across
    // kinds it is trusted only below 2^53, where both are exact.
    let leaf = |a: &str, b: &str| {
        format!("({a} == {b} && (type({a}) == type({b}) || ({a} > -9007199254740992 && {a} < 9007199254740992)))")
    };
    if depth == 0 {
        return leaf(a, b);
    }
    let (x, y, k, i, v) = (
        format!("x{level}"),
        format!("y{level}"),
        format!("k{level}"),
        format!("i{level}"),
        format!("v{level}"),
    );
    let members = same_at(
        depth - 1,
        &format!("{x}[{k}]"),
        &format!("dyn({y}[?{k}].orValue(null))"),
        level + 1,
    );
    let items = same_at(depth - 1, &v, &format!("{y}[{i}]"), level + 1);
    let body = format!(
        "(type({x}) == map && type({y}) == map) \
         ? ({x}.all({k}, {members}) && {y}.all({k}, {k} in {x} || {y}[{k}] == null)) \
         : ((type({x}) == list && type({y}) == list) \
         ? (size({x}) == size({y}) && {x}.all({i}, {v}, {items})) \
         : {})",
        leaf(&x, &y)
    );
    bind(&x, a, &bind(&y, b, &body))
}

/// The items of `list` (an expression giving a list) whose member `key` is
/// the string `value`: the items of a condition type or of a key value.
pub fn items_with(list: &str, key: &str, value: &str) -> String {
    format!(
        "{list}.filter(e, type(e) == map && dyn(e[?{}].orValue(null)) == {})",
        string(key),
        string(value)
    )
}

/// Whether the lists `a` and `b` (expressions) hold the same items in any
/// order, each item compared with [`same`].
pub fn same_items(a: &str, b: &str) -> String {
    let same_item = |x: &str, y: &str| same(x, y);
    let body = format!(
        "size(ia) == size(ib) && \
         (size(ia) == 0 || (size(ia) == 1 ? {} : ia.all(p, ia.filter(q, {}).size() == ib.filter(q, {}).size())))",
        same_item("ia[0]", "ib[0]"),
        same_item("p", "q"),
        same_item("p", "q"),
    );
    bind("ia", a, &bind("ib", b, &body))
}

/// `body` (a condition) with `name` bound to `value`. The API server's CEL
/// has no `cel.bind`; a one-item list's `all` binds as well.
pub fn bind(name: &str, value: &str, body: &str) -> String {
    format!("[{value}].all({name}, {body})")
}

/// `body` (any value) with `name` bound to `value`.
pub fn bind_value(name: &str, value: &str, body: &str) -> String {
    format!("[{value}].map({name}, {body})[0]")
}

/// A JSON Pointer below `/status` for `segments`, escaped as RFC 6901 says.
pub fn pointer<'a>(segments: impl IntoIterator<Item = &'a String>) -> String {
    let mut text = String::from("/status");
    for segment in segments {
        text.push('/');
        text += &segment.replace('~', "~0").replace('/', "~1");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_quoted_with_escapes_cel_reads() {
        assert_eq!(string("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(string("ünï 🙂"), "\"ünï 🙂\"");
    }

    #[test]
    fn paths_index_optionally_segment_by_segment() {
        let path = FieldPath::parse("a.b").unwrap();
        assert_eq!(
            value_at("variables.old", path.segments()),
            r#"dyn([[variables.old].map(pv, type(pv) == map ? dyn(pv[?"a"].orValue(null)) : null)[0]].map(pv, type(pv) == map ? dyn(pv[?"b"].orValue(null)) : null)[0])"#
        );
    }

    #[test]
    fn the_comparison_grows_with_depth_not_with_the_value() {
        // Each level holds the next twice (members, items), and the values
        // are bound once: the text doubles per level, whatever the value.
        let text = same("variables.a", "variables.b");
        let shallower = same_at(NULL_DEPTH - 1, "variables.a", "variables.b", 0);
        assert!(
            text.len() < shallower.len() * 5 / 2,
            "{} vs {}",
            text.len(),
            shallower.len()
        );
        assert!(text.len() < 40_000, "{} bytes", text.len());
        assert_eq!(text.matches('(').count(), text.matches(')').count());
    }

    #[test]
    fn pointers_escape_tilde_and_slash() {
        let segments = vec!["a/b".to_owned(), "c~d".to_owned()];
        assert_eq!(pointer(&segments), "/status/a~1b/c~0d");
    }
}
