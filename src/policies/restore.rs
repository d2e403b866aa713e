//! The JSON Patch a MutatingAdmissionPolicy applies in trim mode: each item
//! another writer owns, changed by this write, put back as `oldObject` has
//! it, as the webhook's `/mutate` does.
//!
//! Only what was changed is touched: a field is set or removed at its path,
//! creating the objects above it that the write dropped; a condition type or
//! keyed entry has its items removed one by one (indices counted down as
//! earlier ones go) and the stored items appended. The whole list is never
//! replaced, which would take the writer's own items with it.
//!
//! Each field and each list is restored by a mutation of its own. The API
//! server applies a policy's mutations in order, each to the object as the
//! ones before left it, so a restore finds the objects an earlier one put
//! back: two fields under a `summary` the write dropped are both restored,
//! not the second `add` of `/status/summary` replacing the first. Within a
//! mutation, ops are built against the object as that mutation sees it, so
//! every `remove` names an index that is there.

use super::{Guarded, cel, violated};
use crate::ownership::{FieldPath, Item, KeyedList, ResourceRules};

/// The largest integer JSONPatch values carry exactly (2^53 - 1, cel-go's
/// JSON-safe bound): CEL's JSON encoding of a patch writes larger ones as
/// strings.
const EXACT_INTEGER: &str = "9007199254740991";

/// The `jsonPatch.expression` of each mutation, in the order they apply:
/// each owned field, then the conditions, then each keyed list.
pub(super) fn patches(resource: &ResourceRules, items: &[Guarded<'_>]) -> Vec<String> {
    let mut parts = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Item::Field(path) = &item.item {
            parts.push(format!("({} ? {} : [])", violated(i, item), restore_field(path)));
        }
    }
    let conditions = KeyedList {
        path: resource.conditions_path.clone(),
        key: "type".to_owned(),
    };
    let condition_items: Vec<(usize, &str)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| match &item.item {
            Item::Condition(ty) => Some((i, ty.as_str())),
            _ => None,
        })
        .collect();
    if !condition_items.is_empty() {
        parts.push(restore_list(
            items,
            &conditions,
            &condition_items,
            "variables.oldConditions",
            "variables.newConditions",
        ));
    }
    for (l, list) in resource.lists.iter().enumerate() {
        let entry_items: Vec<(usize, &str)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match &item.item {
                Item::Entry { list: path, value, .. } if *path == list.path => Some((i, value.as_str())),
                _ => None,
            })
            .collect();
        if !entry_items.is_empty() {
            parts.push(restore_list(
                items,
                list,
                &entry_items,
                &format!("variables.oldList{l}"),
                &format!("variables.newList{l}"),
            ));
        }
    }
    parts
}

fn op(kind: &str, pointer: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!(
            "JSONPatch{{op: {}, path: {pointer}, value: {value}}}",
            cel::string(kind)
        ),
        None => format!("JSONPatch{{op: {}, path: {pointer}}}", cel::string(kind)),
    }
}

/// Sets `path` to `value` (an expression), adding the objects above it
/// that the write lacks: the deepest object already there gets the rest.
fn set(path: &FieldPath, value: &str) -> String {
    let segments = path.segments();
    // From the deepest parent up to the status itself, then the status.
    let mut text = {
        // No status object at all: add `/status` whole.
        let mut nested = value.to_owned();
        for segment in segments.iter().rev() {
            nested = format!("{{{}: {nested}}}", cel::string(segment));
        }
        format!("[{}]", op("add", &cel::string("/status"), Some(&nested)))
    };
    // The deepest object found gets the rest, replacing what the write has
    // below it (nothing, `null`, or a value that is not an object), as the
    // webhook's `FieldPath::add_operation` does.
    for depth in 0..segments.len() {
        let mut nested = value.to_owned();
        for segment in segments[depth + 1..].iter().rev() {
            nested = format!("{{{}: {nested}}}", cel::string(segment));
        }
        let pointer = cel::string(&cel::pointer(&segments[..=depth]));
        let add = format!("[{}]", op("add", &pointer, Some(&nested)));
        text = format!(
            "(type({}) == map ? {add} : {text})",
            cel::value_at("variables.new", &segments[..depth]),
        );
    }
    text
}

/// Puts a field back: removed where the stored status has none, else set.
/// A number JSONPatch cannot carry exactly is not restored, and the Deny
/// policy behind refuses the write.
fn restore_field(path: &FieldPath) -> String {
    let old = cel::value_at("variables.old", path.segments());
    let pointer = cel::string(&cel::pointer(path.segments()));
    let body = format!(
        "o == null ? [{}] : ((type(o) == int && (o > {EXACT_INTEGER} || o < -{EXACT_INTEGER})) ? [] : {})",
        op("remove", &pointer, None),
        set(path, "o")
    );
    cel::bind_value("o", &old, &body)
}

/// Puts back the items of the key values (`(item position, value)`) that
/// this write changed in `list`, as the webhook's `ListRestore` does: the
/// write's items of a restored value are paired in order with the stored
/// ones; a changed one is replaced where it stands, one too many removed,
/// one missing appended (by value, then in stored order).
fn restore_list(
    items: &[Guarded<'_>],
    list: &KeyedList,
    values: &[(usize, &str)],
    old_list: &str,
    new_list: &str,
) -> String {
    let restored: Vec<String> = values
        .iter()
        .map(|&(i, value)| format!("({} ? [{}] : [])", violated(i, &items[i]), cel::string(value)))
        .collect();
    let key = cel::string(&list.key);
    let pointer = cel::pointer(list.path.segments());
    let key_of = |item: &str| format!("(type({item}) == map ? dyn({item}[?{key}].orValue(null)) : null)");
    // The items of `list` whose key is `k`, and the rank of item `i` among
    // the items of its key.
    let of_key = |list: &str, k: &str| format!("{list}.filter(f, {} == {k})", key_of("f"));
    let rank = |list: &str, i: &str, k: &str| {
        format!(
            "{list}.transformList(h, f, h < {i} && {} == {k}, h).size()",
            key_of("f")
        )
    };
    let at = |index: &str| format!("{} + \"/\" + string({index})", cel::string(&pointer));
    let stored_item = format!("{}[{}]", of_key(old_list, "k"), rank(new_list, "i", "k"));
    let replaced = format!(
        "{new_list}.transformList(i, e, {}, {})",
        cel::bind(
            "k",
            &key_of("e"),
            &format!(
                "k in r && {rank} < {stored}.size() && !{same}",
                rank = rank(new_list, "i", "k"),
                stored = of_key(old_list, "k"),
                same = cel::same("e", &stored_item)
            )
        ),
        cel::bind_value("k", &key_of("e"), &op("replace", &at("i"), Some(&stored_item)))
    );
    let removed = format!(
        "{new_list}.transformList(i, e, {}, i).transformList(j, n, {})",
        cel::bind(
            "k",
            &key_of("e"),
            &format!(
                "k in r && {} >= {}.size()",
                rank(new_list, "i", "k"),
                of_key(old_list, "k")
            )
        ),
        op("remove", &at("n - j"), None)
    );
    let mut sorted: Vec<&str> = values.iter().map(|&(_, value)| value).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let appended: Vec<String> = sorted
        .iter()
        .map(|value| {
            let k = cel::string(value);
            format!(
                "({k} in r ? {old_list}.transformList(i, e, {} == {k} && {} >= {}.size(), {}) : [])",
                key_of("e"),
                rank(old_list, "i", &k),
                of_key(new_list, &k),
                op("add", &cel::string(&format!("{pointer}/-")), Some("e"))
            )
        })
        .collect();
    // No list in the write: the stored items of the restored values, by value.
    let whole: Vec<String> = sorted
        .iter()
        .map(|value| {
            let k = cel::string(value);
            format!("({k} in r ? {} : [])", of_key(old_list, &k))
        })
        .collect();
    let there = cel::value_at("variables.new", list.path.segments());
    let stored = cel::value_at("variables.old", list.path.segments());
    // A list the stored status lacks, left with none of the write's items,
    // is removed rather than left empty, as the webhook does.
    let emptied = format!("{stored} == null && {new_list}.all(e, {} in r)", key_of("e"));
    let body = format!(
        "size(r) == 0 ? [] : (type({there}) == list ? ({emptied} ? [{remove}] : {replaced} + {removed} + {appended}) : {set_whole})",
        appended = appended.join(" + "),
        remove = op("remove", &cel::string(&pointer), None),
        set_whole = set(&list.path, &format!("({})", whole.join(" + "))),
    );
    cel::bind_value("r", &restored.join(" + "), &body)
}
