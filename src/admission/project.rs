//! Projection: the parts of a status that the rules read, built from JSON
//! text without building anything else. Both readers use it: the single
//! pass while it reads a body, the two-pass path on the status text the
//! wire parse kept.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::cursor::Cursor;
use super::fingerprint;
use super::wire::BorrowedKey;
use crate::ownership::{FieldPath, KeyedItems, PathTree};
use crate::value_budget::ValueBudget;

/// The statuses of `oldObject` and `object`, projected: `None` for an
/// absent (or `null`) object, `Some(None)` for an object without a status.
#[derive(Debug, Default)]
pub(crate) struct ProjectedStatuses {
    pub(crate) old: Option<Option<Value>>,
    pub(crate) new: Option<Option<Value>>,
    /// The groups of items proven changed by their fingerprints (only
    /// where [`realize`] was asked to prove).
    pub(crate) changed: ChangedGroups,
}

/// Groups of items of a list read item by item (the conditions of one
/// type, the entries of one key value) that [`realize`] proved changed by
/// their fingerprints (see `fingerprint`) and left unbuilt in both
/// statuses: by the path of their list below the status, and their key
/// values.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ChangedGroups(BTreeMap<Vec<String>, BTreeMap<String, ChangedGroup>>);

/// Where a changed group's items are in the new list, and what its old
/// items were, for a restore.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ChangedGroup {
    /// By position among the group's items in the new list: its index in
    /// the list, and whether it is the same value as the old list's item at
    /// the same position among the group's (`false` where there is none).
    /// Empty unless [`Proofs::Restore`].
    pub(crate) new_items: Vec<(usize, bool)>,
    /// The group's old items, in order, as the JSON text a restore writes
    /// back (see [`item_text`]). Empty unless [`Proofs::Restore`].
    pub(crate) old_items: Vec<Vec<u8>>,
}

impl ChangedGroups {
    /// The key values proven changed in the list at `list`.
    pub(crate) fn of(&self, list: &FieldPath) -> impl Iterator<Item = &str> {
        self.in_list(list).map(|(key, _)| key)
    }

    /// The groups proven changed in the list at `list`.
    pub(crate) fn in_list(&self, list: &FieldPath) -> impl Iterator<Item = (&str, &ChangedGroup)> {
        self.0
            .get(list.segments())
            .into_iter()
            .flatten()
            .map(|(k, g)| (k.as_str(), g))
    }
}

impl ProjectedStatuses {
    /// Both projections dropped without recursion: a projection made on
    /// the unbounded path may be nested as deep as the API server allows.
    pub(crate) fn drop_iteratively(self) {
        self.old
            .flatten()
            .into_iter()
            .chain(self.new.flatten())
            .for_each(crate::ownership::drop_iteratively);
    }
}

/// What [`realize`] proves by fingerprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proofs {
    /// Nothing: every value whose text differs is built.
    Off,
    /// Which groups changed, for a decision that names them (`/validate`):
    /// neither side of a group proven changed is built.
    Names,
    /// Which groups changed, where their new items are, and their old
    /// items' text, for a restore (`/mutate`): neither side is built.
    Restore,
}

/// How deep a parse may nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Depth {
    /// serde_json's default limit (128): for the ordinary stack.
    Bounded,
    /// No limit: only on a stack sized for the text's measured nesting.
    Unbounded,
}

impl Depth {
    /// A reader of `text` nested as deep as this allows.
    fn reader(self, text: &str) -> serde_json::Deserializer<serde_json::de::StrRead<'_>> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        if self == Depth::Unbounded {
            deserializer.disable_recursion_limit();
        }
        deserializer
    }
}

/// Why the status of an object could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ProjectError {
    /// Nested deeper than a [`Depth::Bounded`] parse allows: parse again
    /// with [`Depth::Unbounded`] on a stack that fits [`nesting_depth`].
    #[error("nested deeper than the bounded parse allows")]
    TooDeep,
    /// Its values would need more memory than one review is given.
    #[error("{}", crate::value_budget::BudgetExceeded)]
    TooLarge,
    /// Not JSON (the API server never sends this).
    #[error("the object is not valid JSON: {0}")]
    Malformed(serde_json::Error),
}

/// The parts of a status that `paths` names, as a JSON value that holds
/// nothing else: each read path with its whole value, and the object
/// parents that lead to it. A parent that is not an object is kept as
/// `false` (it only matters that it is not an object); a `null` status is
/// `None`. In a list read item by item (the conditions, a keyed list), an
/// item whose key `paths` does not read is kept as `null`, so that every
/// item keeps its index. (The readers
/// capture both statuses and [`realize`] them together.)
#[cfg(test)]
pub(crate) fn project_status(status: &RawValue, paths: &PathTree, depth: Depth) -> Result<Option<Value>, ProjectError> {
    capture_status(status, paths, None, depth)?
        .map(|captured| build(&captured, depth))
        .transpose()
}

/// A status as read on the rules' paths, before anything is built: the
/// text of each value read whole, borrowed from the review. The two
/// statuses of a write are compared as text first ([`realize`]): the API
/// server encodes `object` and `oldObject` alike, so a value that did not
/// change is the same bytes in both, and is never built.
#[derive(Debug, Clone)]
pub(crate) enum Captured<'de> {
    /// A value read whole: its text (validated JSON, without the white
    /// space around it).
    Whole(&'de str),
    /// A value of the writer's own: never compared, so never read.
    Own,
    /// An object the paths lead through: the members they read below it
    /// (the last of duplicate keys wins, as in Go and serde_json).
    Object(Vec<(String, Captured<'de>)>),
    /// A list read item by item (the conditions, a keyed list): each item
    /// in place, `None` where its key is not read.
    Items(Vec<Option<CapturedItem<'de>>>),
    /// Anything else, as the projection holds it: `null`, or
    /// [`NOT_AN_OBJECT`] for a parent of another kind.
    Settled(Value),
}

/// An item of a list read item by item, whose key is read: the key's value
/// (a condition's type, a keyed entry's owner) and its members' text.
#[derive(Debug, Clone)]
pub(crate) struct CapturedItem<'de> {
    key: Cow<'de, str>,
    members: ItemMembers<'de>,
}

/// An item's members: each key, and its value's text as read (validated
/// JSON, without the white space around it).
pub(crate) type ItemMembers<'de> = Vec<(Cow<'de, str>, &'de str)>;

/// What is held for a member of an item, counted as built values are: a
/// slot (doubled for the vector's growth) and an unescaped key.
// A `Cow`, not a `str`: whether the key was unescaped is what is counted.
#[allow(clippy::ptr_arg)]
pub(crate) fn spend_on_member<E: serde::de::Error>(key: &Cow<'_, str>) -> Result<(), E> {
    let held =
        2 * std::mem::size_of::<(Cow<'_, str>, &str)>() + if matches!(key, Cow::Owned(_)) { key.len() } else { 0 };
    ValueBudget::spend::<E>(held)
}

impl<'de> Captured<'de> {
    /// A value the tree `tree` reads whole, of text `text`, for a write by
    /// the writer at position `writer`: its own values are never compared.
    pub(crate) fn whole(tree: &PathTree, writer: Option<usize>, text: &'de str) -> Self {
        if writer.is_some() && tree.owner() == writer {
            Captured::Own
        } else {
            Captured::Whole(text)
        }
    }
}

impl<'de> CapturedItem<'de> {
    /// The item of these members, if its key is one `keyed` reads and not
    /// the writer's (at `writer`) own; else the members back.
    pub(crate) fn of(
        keyed: &KeyedItems,
        writer: Option<usize>,
        members: ItemMembers<'de>,
    ) -> Result<Self, ItemMembers<'de>> {
        match key_of(&members, &keyed.member).filter(|key| match keyed.values.get(key.as_ref()) {
            Some(owner) => writer.is_none() || *owner != writer,
            None => false,
        }) {
            Some(key) => Ok(CapturedItem { key, members }),
            None => Err(members),
        }
    }

    /// Its members' text.
    pub(crate) fn members(&self) -> &ItemMembers<'de> {
        &self.members
    }
}

/// An item's key: the string in its member `member`. The last such member
/// counts, as the last of duplicate keys does in a value.
fn key_of<'de>(members: &ItemMembers<'de>, member: &str) -> Option<Cow<'de, str>> {
    members
        .iter()
        .rev()
        .find(|(key, _)| key == member)
        .and_then(|(_, raw)| string_of(raw))
}

/// The string a member's text holds, if it is a string: borrowed where it
/// holds no escape (a key's usual text: the text was validated as it was
/// read, so it has no control character either), else unescaped.
fn string_of(text: &str) -> Option<Cow<'_, str>> {
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) if !inner.contains('\\') => Some(Cow::Borrowed(inner)),
        Some(_) => serde_json::from_str::<String>(text).ok().map(Cow::Owned),
        None => None,
    }
}

impl CapturedItem<'_> {
    fn same_text(&self, other: &Self) -> bool {
        self.members.len() == other.members.len()
            && self
                .members
                .iter()
                .zip(&other.members)
                .all(|((k, v), (l, w))| k == l && v == w)
    }
}

/// The status text captured on `paths` (see [`Captured`]) for a write by
/// the writer at position `writer` (whose own values are skipped); `None`
/// for a `null` status.
pub(crate) fn capture_status<'de>(
    status: &'de RawValue,
    paths: &PathTree,
    writer: Option<usize>,
    depth: Depth,
) -> Result<Option<Captured<'de>>, ProjectError> {
    let mut deserializer = depth.reader(status.get());
    let captured = Capture(paths, writer)
        .deserialize(&mut deserializer)
        .map_err(project_error)?;
    Ok(match captured {
        Captured::Settled(Value::Null) => None,
        other => Some(other),
    })
}

fn project_error(e: serde_json::Error) -> ProjectError {
    if is_recursion_limit(&e) {
        ProjectError::TooDeep
    } else if crate::value_budget::is_budget_exceeded(&e) {
        ProjectError::TooLarge
    } else {
        ProjectError::Malformed(e)
    }
}

/// Which status a value came from, for an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Old,
    New,
}

/// The two captured statuses of a write, projected as [`project_status`]
/// projects each, except that every read value whose text is the same in
/// both is left out of both (and, in a list read item by item, every key
/// value whose items are the same text, in the same order, is `null` in
/// both): the decision finds
/// nothing changed there, as it would have after building and comparing
/// them. Only values whose text differs are built, with the full semantics
/// (absent equals `null`, exact numbers, items in any order).
///
/// With [`Proofs::Names`] or [`Proofs::Restore`], a key value whose items
/// differ in text is first fingerprinted: where the fingerprints prove the
/// items changed, its items are left out unbuilt too, and it is named in
/// [`ProjectedStatuses::changed`] (for a restore, with its old items' text).
pub(crate) fn realize(
    old: Option<Option<Captured<'_>>>,
    new: Option<Option<Captured<'_>>>,
    depth: Depth,
    proofs: Proofs,
) -> Result<ProjectedStatuses, (Side, ProjectError)> {
    let mut proving = (proofs != Proofs::Off).then(|| Proving {
        restore: proofs == Proofs::Restore,
        ..Proving::default()
    });
    let (old_status, new_status) = match (&old, &new) {
        (Some(Some(o)), Some(Some(n))) => pair(o, n, depth, proving.as_mut())?,
        _ => (
            built(old.as_ref().and_then(Option::as_ref), Side::Old, depth)?,
            built(new.as_ref().and_then(Option::as_ref), Side::New, depth)?,
        ),
    };
    Ok(ProjectedStatuses {
        old: old.map(|o| o.and(old_status)),
        new: new.map(|n| n.and(new_status)),
        changed: proving.map(|p| p.changed).unwrap_or_default(),
    })
}

fn built(captured: Option<&Captured<'_>>, side: Side, depth: Depth) -> Result<Option<Value>, (Side, ProjectError)> {
    captured.map(|c| build(c, depth)).transpose().map_err(|e| (side, e))
}

/// Where [`pair`] is, and the groups it proved changed.
#[derive(Default)]
struct Proving {
    path: Vec<String>,
    changed: ChangedGroups,
    /// For a restore (see [`Proofs::Restore`]).
    restore: bool,
}

impl Proving {
    /// Names the groups proven changed in the list at [`Proving::path`],
    /// by key value. Moved, not copied: a restore's text is counted once.
    fn name<'k>(&mut self, proven: impl IntoIterator<Item = (&'k str, ChangedGroup)>) {
        let mut proven = proven.into_iter().peekable();
        if proven.peek().is_some() {
            let groups = self.changed.0.entry(self.path.clone()).or_default();
            groups.extend(proven.map(|(k, g)| (k.to_owned(), g)));
        }
    }
}

/// Both sides of one captured value, each `None` where it is left out.
fn pair(
    old: &Captured<'_>,
    new: &Captured<'_>,
    depth: Depth,
    mut proving: Option<&mut Proving>,
) -> Result<(Option<Value>, Option<Value>), (Side, ProjectError)> {
    Ok(match (old, new) {
        (Captured::Whole(o), Captured::Whole(n)) if o == n => (None, None),
        (Captured::Own, _) | (_, Captured::Own) => (None, None),
        // Objects stay, even emptied: a parent that exists is not created
        // again by a restoring patch.
        (Captured::Object(o), Captured::Object(n)) => {
            let (mut old_map, mut new_map) = (Map::new(), Map::new());
            for (key, old_child) in o {
                match find(n, key) {
                    Some(new_child) => {
                        if let Some(p) = proving.as_deref_mut() {
                            p.path.push(key.clone());
                        }
                        let (o, n) = pair(old_child, new_child, depth, proving.as_deref_mut())?;
                        if let Some(p) = proving.as_deref_mut() {
                            p.path.pop();
                        }
                        o.map(|v| old_map.insert(key.clone(), v));
                        n.map(|v| new_map.insert(key.clone(), v));
                    }
                    None if matches!(old_child, Captured::Own) => {}
                    None => {
                        old_map.insert(key.clone(), build(old_child, depth).map_err(|e| (Side::Old, e))?);
                    }
                }
            }
            for (key, new_child) in n {
                if find(o, key).is_none() && !matches!(new_child, Captured::Own) {
                    new_map.insert(key.clone(), build(new_child, depth).map_err(|e| (Side::New, e))?);
                }
            }
            (Some(Value::Object(old_map)), Some(Value::Object(new_map)))
        }
        (Captured::Items(o), Captured::Items(n)) => {
            let left_out = if aligned(o, n) {
                LeftOut::ByIndex(aligned_left_out(o, n, depth, proving)?)
            } else {
                LeftOut::ByKey(grouped_left_out(o, n, depth, proving)?)
            };
            let list = |items: &[Option<CapturedItem<'_>>], side| {
                let mut built = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    built.push(match item {
                        Some(item) if !left_out.holds(index, item) => build_item(item, depth).map_err(|e| (side, e))?,
                        _ => Value::Null,
                    });
                }
                Ok::<_, (Side, ProjectError)>(Value::Array(built))
            };
            (Some(list(o, Side::Old)?), Some(list(n, Side::New)?))
        }
        (o, n) => (
            Some(build(o, depth).map_err(|e| (Side::Old, e))?),
            Some(build(n, depth).map_err(|e| (Side::New, e))?),
        ),
    })
}

/// The items of two lists read item by item that are left out of both
/// projections: unchanged, or proven changed (named in [`Proving`]).
enum LeftOut<'a> {
    /// By index, for [`aligned`] lists.
    ByIndex(Vec<bool>),
    /// By key value.
    ByKey(BTreeSet<&'a str>),
}

impl LeftOut<'_> {
    fn holds(&self, index: usize, item: &CapturedItem<'_>) -> bool {
        match self {
            LeftOut::ByIndex(out) => out.get(index).copied().unwrap_or(false),
            LeftOut::ByKey(keys) => keys.contains(item.key.as_ref()),
        }
    }
}

/// Whether two lists read item by item hold the same read keys at the same
/// places, each key once: the shape of a controller's write (it rewrites
/// its conditions, its entries, in place). Each key's group is then the two
/// items at one index, and [`aligned_left_out`] answers without grouping
/// what [`grouped_left_out`] answers by grouping.
fn aligned(old: &[Option<CapturedItem<'_>>], new: &[Option<CapturedItem<'_>>]) -> bool {
    if old.len() != new.len() {
        return false;
    }
    let mut keys = Vec::with_capacity(old.len());
    for pair in old.iter().zip(new) {
        match pair {
            (Some(a), Some(b)) if a.key == b.key => keys.push(a.key.as_ref()),
            (None, None) => {}
            _ => return false,
        }
    }
    keys.sort_unstable();
    keys.windows(2).all(|w| w[0] != w[1])
}

/// [`grouped_left_out`] for [`aligned`] lists, by index: a group is one old
/// and one new item, so its items are unchanged where their text is the
/// same, and proven changed where the fingerprints of the two differ (at
/// the place their text first differs, or whole); no map, no sort.
fn aligned_left_out(
    old: &[Option<CapturedItem<'_>>],
    new: &[Option<CapturedItem<'_>>],
    depth: Depth,
    proving: Option<&mut Proving>,
) -> Result<Vec<bool>, (Side, ProjectError)> {
    let mut out = Vec::with_capacity(old.len());
    let mut proven = Vec::new();
    for (index, pair) in old.iter().zip(new).enumerate() {
        let (Some(a), Some(b)) = pair else {
            out.push(false);
            continue;
        };
        let left_out = if a.same_text(b) {
            true
        } else if let Some(p) = proving.as_deref()
            && proven_one(a, b)
        {
            let mut group = ChangedGroup::default();
            if p.restore {
                // The only new item of the group is not its old one: its
                // text differs, and a fingerprint says so.
                group.new_items.push((index, false));
                group.old_items.push(item_text(a, depth).map_err(|e| (Side::Old, e))?);
            }
            proven.push((a.key.as_ref(), group));
            true
        } else {
            false
        };
        out.push(left_out);
    }
    if let Some(p) = proving {
        p.name(proven);
    }
    Ok(out)
}

/// Whether the fingerprints of two items prove them different, as
/// [`proven_changed`] proves a group of one old and one new item.
fn proven_one(old: &CapturedItem<'_>, new: &CapturedItem<'_>) -> bool {
    let differ = |path: &[fingerprint::Step<'_>]| {
        matches!(
            (fingerprint::at_path(&old.members, path), fingerprint::at_path(&new.members, path)),
            (Some(a), Some(b)) if a != b
        )
    };
    let path = fingerprint::first_difference(&old.members, &new.members).unwrap_or_default();
    (!path.is_empty() && differ(&path)) || differ(&[])
}

/// The key values whose items differ between the lists `old` and `new`
/// (each the whole of its text), items keyed by the string in their member
/// `member`, told from the items' text as [`realize`] tells it: a key value
/// whose items are the same text in the same order is unchanged, one whose
/// fingerprints differ changed. `None` where that cannot be told: a text
/// that is not a list (or too deep to read here, or whose items' members
/// are more than the budget of values in force holds), a key value left in doubt,
/// none changed, or, with `one_per_key`, a key value with more than one item
/// in a list (its last item is then the one that counts, which the
/// multisets compared here do not follow). The caller then builds both
/// lists and compares them. Nothing is built.
pub(crate) fn changed_keys_by_text(old: &str, new: &str, member: &str, one_per_key: bool) -> Option<BTreeSet<String>> {
    let (old, new) = (keyed_items(old, member)?, keyed_items(new, member)?);
    let mut all = BTreeSet::new();
    for items in [&old, &new] {
        let mut keys = BTreeSet::new();
        for item in items.iter().flatten() {
            if !keys.insert(item.key.as_ref()) && one_per_key {
                return None;
            }
        }
        all.extend(keys);
    }
    let unchanged = unchanged_keys(&old, &new);
    let proven = proven_changed(&old, &new, &unchanged, false);
    let told = |key: &&str| unchanged.contains(key) || proven.contains_key(key);
    if proven.is_empty() || !all.iter().all(told) {
        return None;
    }
    Some(proven.into_keys().map(str::to_owned).collect())
}

/// The items of the list that is the whole of `text`, each object item
/// captured with its key (the string in its member `member`), anything
/// else `None`; `None` where the text cannot be read here, or its members
/// are more than the budget of values in force holds.
fn keyed_items<'t>(text: &'t str, member: &str) -> Option<Vec<Option<CapturedItem<'t>>>> {
    let mut cursor = Cursor::new(text);
    let mut items = Vec::new();
    let read = cursor.list(|cursor, _| {
        if cursor.peek() != Some(b'{') {
            cursor.skip()?;
            items.push(None);
            return Ok(());
        }
        let mut members = Vec::new();
        cursor.object(|cursor, key| {
            // Held as the single pass holds an item's members: counted.
            spend_on_member::<serde_json::Error>(&key)?;
            members.push((key, cursor.skip()?));
            Ok(())
        })?;
        items.push(key_of(&members, member).map(|key| CapturedItem { key, members }));
        Ok(())
    });
    read.and_then(|()| cursor.end()).ok()?;
    Some(items)
}

/// The key values whose items are left out of both projections: those
/// whose items are the same text, in the same order ([`unchanged_keys`]),
/// and, when proving, those proven changed (named in `proving`, with what
/// a restore needs).
fn grouped_left_out<'a>(
    old: &'a [Option<CapturedItem<'_>>],
    new: &'a [Option<CapturedItem<'_>>],
    depth: Depth,
    proving: Option<&mut Proving>,
) -> Result<BTreeSet<&'a str>, (Side, ProjectError)> {
    let mut left_out = unchanged_keys(old, new);
    if let Some(p) = proving {
        let mut proven = proven_changed(old, new, &left_out, p.restore);
        if p.restore {
            // What a restore writes back: the old items' text, never built.
            for item in old.iter().flatten() {
                if let Some(group) = proven.get_mut(item.key.as_ref()) {
                    group
                        .old_items
                        .push(item_text(item, depth).map_err(|e| (Side::Old, e))?);
                }
            }
        }
        left_out.extend(proven.keys().copied());
        p.name(proven);
    }
    Ok(left_out)
}

/// The key values, of two lists read item by item, whose items their
/// fingerprints prove changed; `unchanged` are left out. Nothing is built,
/// so nothing is spent of the review's budget.
///
/// The items of a key value are compared as [`same_items`] compares them,
/// as multisets, by three proofs, each only where the one before proves
/// nothing: their number; the fingerprint of each at the place where the
/// first changed pair first differs ([`fingerprint::at_path`]); the
/// fingerprint of each whole. Any doubt (a key written twice, a value too
/// deep to fingerprint here) leaves the key value to be built and compared.
///
/// For a `restore`, each new item of a group proven changed is also told
/// the same as its old counterpart or not (as the restore pairs them: in
/// order within the group), by its text, or by fingerprints that differ;
/// a group where that cannot be told is left to be built.
///
/// [`same_items`]: super::decide::compare::same_items
fn proven_changed<'a>(
    old: &'a [Option<CapturedItem<'_>>],
    new: &'a [Option<CapturedItem<'_>>],
    unchanged: &BTreeSet<&str>,
    restore: bool,
) -> BTreeMap<&'a str, ChangedGroup> {
    // By key value: the old items, and the new ones with their index.
    type Group<'a, 'de> = (Vec<&'a CapturedItem<'de>>, Vec<(usize, &'a CapturedItem<'de>)>);
    let mut groups: BTreeMap<&'a str, Group<'a, '_>> = BTreeMap::new();
    let changed = |item: &&CapturedItem<'_>| !unchanged.contains(item.key.as_ref());
    for item in old.iter().flatten().filter(changed) {
        groups.entry(item.key.as_ref()).or_default().0.push(item);
    }
    for (index, item) in new.iter().enumerate() {
        if let Some(item) = item.as_ref().filter(changed) {
            groups.entry(item.key.as_ref()).or_default().1.push((index, item));
        }
    }
    groups
        .into_iter()
        .filter_map(|(key, (o, n))| {
            // The first pair whose text differs, and where it first differs.
            let path = o
                .iter()
                .zip(&n)
                .find_map(|(a, (_, b))| fingerprint::first_difference(&a.members, &b.members))
                .unwrap_or_default();
            // Each proof's fingerprints, taken once, when first asked for.
            let at_path = OnceCell::new();
            let at_path = || at_path.get_or_init(|| Prints::of(&o, &n, |i| fingerprint::at_path(&i.members, &path)));
            let whole = OnceCell::new();
            let whole = || whole.get_or_init(|| Prints::of(&o, &n, |i| fingerprint::at_path(&i.members, &[])));
            let proven = o.len() != n.len() || (!path.is_empty() && at_path().differ()) || whole().differ();
            if !proven {
                return None;
            }
            let mut group = ChangedGroup::default();
            if restore {
                for (i, &(index, item)) in n.iter().enumerate() {
                    let same = match o.get(i) {
                        None => false,
                        Some(previous) if previous.same_text(item) => true,
                        Some(_) if (!path.is_empty() && at_path().tell(i)) || whole().tell(i) => false,
                        Some(_) => return None,
                    };
                    group.new_items.push((index, same));
                }
            }
            Some((key, group))
        })
        .collect()
}

/// The fingerprints of a group's old and new items by one proof, in order
/// (`None`: unsure).
struct Prints {
    old: Vec<Option<u64>>,
    new: Vec<Option<u64>>,
}

impl Prints {
    fn of(
        old: &[&CapturedItem<'_>],
        new: &[(usize, &CapturedItem<'_>)],
        print: impl Fn(&CapturedItem<'_>) -> Option<u64>,
    ) -> Self {
        Self {
            old: old.iter().map(|item| print(item)).collect(),
            new: new.iter().map(|(_, item)| print(item)).collect(),
        }
    }

    /// Whether they prove the items changed: all sure, and different as multisets.
    fn differ(&self) -> bool {
        let sorted = |prints: &[Option<u64>]| {
            let mut sorted = prints.iter().copied().collect::<Option<Vec<u64>>>()?;
            sorted.sort_unstable();
            Some(sorted)
        };
        matches!((sorted(&self.old), sorted(&self.new)), (Some(a), Some(b)) if a != b)
    }

    /// Whether they prove the `i`th new item different from the `i`th old one.
    fn tell(&self, i: usize) -> bool {
        matches!((self.old.get(i), self.new.get(i)), (Some(Some(a)), Some(Some(b))) if a != b)
    }
}

/// The member `key` of a captured object: the last one, as a parse keeps.
fn find<'c, 'de>(members: &'c [(String, Captured<'de>)], key: &str) -> Option<&'c Captured<'de>> {
    members.iter().rev().find(|(k, _)| k == key).map(|(_, c)| c)
}

/// The key values (condition types, entry owners) whose items are the same
/// text, in the same order, in both lists.
fn unchanged_keys<'a>(old: &'a [Option<CapturedItem<'_>>], new: &'a [Option<CapturedItem<'_>>]) -> BTreeSet<&'a str> {
    let mut by_type: BTreeMap<&str, (Vec<&CapturedItem<'_>>, Vec<&CapturedItem<'_>>)> = BTreeMap::new();
    for item in old.iter().flatten() {
        by_type.entry(item.key.as_ref()).or_default().0.push(item);
    }
    for item in new.iter().flatten() {
        by_type.entry(item.key.as_ref()).or_default().1.push(item);
    }
    by_type
        .into_iter()
        .filter(|(_, (o, n))| o.len() == n.len() && o.iter().zip(n).all(|(a, b)| a.same_text(b)))
        .map(|(ty, _)| ty)
        .collect()
}

/// A captured value built as the projection holds it.
fn build(captured: &Captured<'_>, depth: Depth) -> Result<Value, ProjectError> {
    Ok(match captured {
        Captured::Whole(text) => build_text(text, depth)?,
        Captured::Object(members) => {
            let mut map = Map::new();
            for (key, child) in members {
                if !matches!(child, Captured::Own) {
                    map.insert(key.clone(), build(child, depth)?);
                }
            }
            Value::Object(map)
        }
        Captured::Items(items) => {
            let mut built = Vec::with_capacity(items.len());
            for item in items {
                built.push(match item {
                    Some(item) => build_item(item, depth)?,
                    None => Value::Null,
                });
            }
            Value::Array(built)
        }
        Captured::Settled(value) => value.clone(),
        // Left out by its parent; a status is never one value of its own.
        Captured::Own => Value::Null,
    })
}

/// An item's JSON text, written from its members' text as read: what a
/// restore writes back, without building it. Of duplicate keys only the
/// last is written, the one a parse keeps. Each value is first read as
/// building it would read it ([`Readable`]), so that what cannot be built
/// (a number beyond a double's range, a lone surrogate) is refused as
/// before, never copied into a patch. The text is held until the answer
/// is encoded, so it spends from the review's budget.
fn item_text(item: &CapturedItem<'_>, depth: Depth) -> Result<Vec<u8>, ProjectError> {
    let members = &item.members;
    // The members a parse keeps: the last of each key. Items have a few
    // members; a set only where one has many.
    let last: Option<HashMap<&str, usize>> = (members.len() > 16).then(|| {
        members
            .iter()
            .enumerate()
            .map(|(i, (key, _))| (key.as_ref(), i))
            .collect()
    });
    let kept = |i: usize, key: &str| match &last {
        Some(last) => last.get(key) == Some(&i),
        None => !members[i + 1..].iter().any(|(k, _)| k == key),
    };
    let length: usize = members.iter().map(|(key, raw)| key.len() + raw.len() + 4).sum();
    let mut text = Vec::with_capacity(length + 2);
    text.push(b'{');
    for (i, (key, raw)) in members.iter().enumerate() {
        // Every member, as building reads every member, also one a later
        // duplicate replaces.
        Readable::deserialize(&mut depth.reader(raw)).map_err(project_error)?;
        if !kept(i, key) {
            continue;
        }
        if text.len() > 1 {
            text.push(b',');
        }
        serde_json::to_writer(&mut text, key.as_ref()).map_err(ProjectError::Malformed)?;
        text.push(b':');
        text.extend_from_slice(raw.as_bytes());
    }
    text.push(b'}');
    // What is held: escaped keys may have grown it past the estimate.
    ValueBudget::spend::<serde_json::Error>(text.capacity()).map_err(project_error)?;
    Ok(text)
}

fn build_item(item: &CapturedItem<'_>, depth: Depth) -> Result<Value, ProjectError> {
    let mut map = Map::new();
    for (key, raw) in &item.members {
        map.insert(key.as_ref().to_owned(), build_text(raw, depth)?);
    }
    Ok(Value::Object(map))
}

fn build_text(text: &str, depth: Depth) -> Result<Value, ProjectError> {
    crate::value_budget::build(&mut depth.reader(text)).map_err(project_error)
}

/// serde_json names no error code publicly; this is its message for
/// `ErrorCode::RecursionLimitExceeded` (pinned by a test), also where a
/// condition item's own parse passes it on.
fn is_recursion_limit(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// The deepest nesting of arrays and objects in JSON text, counted without
/// recursion (string contents are skipped).
pub fn nesting_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for byte in json.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A map key, kept only when `tree` reads below it.
struct ChildKey<'t>(&'t PathTree);

impl<'de, 't> DeserializeSeed<'de> for ChildKey<'t> {
    type Value = Option<(String, &'t PathTree)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, 't> Visitor<'de> for ChildKey<'t> {
    type Value = Option<(String, &'t PathTree)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.child(key).map(|child| (key.to_owned(), child)))
    }
}

/// A value captured on `tree` for a write by the writer at position `.1`:
/// its text where the tree reads it whole (unless it is the writer's own),
/// else only the keys the tree names.
pub(crate) struct Capture<'t>(pub(crate) &'t PathTree, pub(crate) Option<usize>);

impl<'de> DeserializeSeed<'de> for Capture<'_> {
    type Value = Captured<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        if self.0.is_whole() {
            <&'de RawValue>::deserialize(deserializer).map(|raw| Captured::whole(self.0, self.1, raw.get()))
        } else if let Some(keyed) = self.0.keyed() {
            deserializer.deserialize_any(ItemsOf(keyed, self.1))
        } else {
            deserializer.deserialize_any(self)
        }
    }
}

/// The scalar visits of a capturing visitor: `null` becomes `$null`, any
/// other scalar `$other`.
macro_rules! scalars_as {
    ($null:expr, $other:expr) => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($null)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }

        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
}

/// A built value's slot: what a `null` placeholder of a list item costs.
pub(crate) const SLOT: usize = std::mem::size_of::<Value>();

/// What stands for a parent that is not an object: only its kind matters.
const NOT_AN_OBJECT: Value = Value::Bool(false);

impl<'de> Visitor<'de> for Capture<'_> {
    type Value = Captured<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Vec<(String, Captured<'de>)> = Vec::new();
        while let Some(key) = map.next_key_seed(ChildKey(self.0))? {
            match key {
                Some((key, child)) => {
                    ValueBudget::spend::<A::Error>(2 * std::mem::size_of::<(String, Captured<'de>)>() + key.len())?;
                    let value = map.next_value_seed(Capture(child, self.1))?;
                    // The last of duplicate keys wins, as in Go and serde_json.
                    members.retain(|(k, _)| *k != key);
                    members.push((key, value));
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Captured::Object(members))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Captured::Settled(NOT_AN_OBJECT))
    }

    scalars_as!(Captured::Settled(Value::Null), Captured::Settled(NOT_AN_OBJECT));
}

/// A list read item by item (the conditions, a keyed list): every item
/// kept in place, captured only when its key is one of the read values (the
/// others are `None`). Anything but a list stands for what it is: absent,
/// or not a list.
struct ItemsOf<'t>(&'t KeyedItems, Option<usize>);

/// One item of such a list: its members are kept as unparsed text; only an
/// item whose key is read, and not the writer's (`.1`) own, is captured
/// (the members of another object are given back); anything but an object
/// is `None`.
pub(crate) struct ListItem<'t>(pub(crate) &'t KeyedItems, pub(crate) Option<usize>);

/// An item as [`ListItem`] reads it.
pub(crate) type ItemRead<'de> = Option<Result<CapturedItem<'de>, ItemMembers<'de>>>;

impl<'de> DeserializeSeed<'de> for ListItem<'_> {
    type Value = ItemRead<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ListItem<'_> {
    type Value = ItemRead<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // A condition has six members.
        let mut members: ItemMembers<'de> = Vec::with_capacity(8);
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            spend_on_member::<A::Error>(&key)?;
            members.push((key, map.next_value::<&'de RawValue>()?.get()));
        }
        Ok(Some(CapturedItem::of(self.0, self.1, members)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_as!(None, None);
}

impl<'de> Visitor<'de> for ItemsOf<'_> {
    type Value = Captured<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(ListItem(self.0, self.1))? {
            let item = item.and_then(Result::ok);
            // A slot (doubled for growth), and the `null` it may become.
            ValueBudget::spend::<A::Error>(2 * std::mem::size_of::<Option<CapturedItem<'de>>>() + SLOT)?;
            items.push(item);
        }
        Ok(Captured::Items(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Captured::Settled(NOT_AN_OBJECT))
    }

    scalars_as!(Captured::Settled(Value::Null), Captured::Settled(NOT_AN_OBJECT));
}

/// A value read as building it reads it (numbers parsed, strings
/// unescaped), and built into nothing: whether it can be built.
/// `fingerprint::of_text` reads values the same way, but hashes each:
/// checking a restore's items with it cost the route's trim 15 % more
/// (107 against 124 µs in `cargo bench --bench decision -- route`).
struct Readable;

impl<'de> Deserialize<'de> for Readable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Readable)
    }
}

impl<'de> Visitor<'de> for Readable {
    type Value = Readable;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<Readable, Readable>()?.is_some() {}
        Ok(Readable)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Readable>()?.is_some() {}
        Ok(Readable)
    }

    scalars_as!(Readable, Readable);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::wire::ObjectView;
    use crate::ownership::FieldPath;
    use serde_json::json;

    fn tree(paths: &[&str]) -> PathTree {
        let paths: Vec<FieldPath> = paths.iter().map(|p| FieldPath::parse(p).unwrap()).collect();
        PathTree::of(&paths)
    }

    fn project(object: Value, paths: &[&str]) -> Option<Value> {
        let text = serde_json::to_string(&object).unwrap();
        let view: ObjectView<'_> = serde_json::from_str(&text).unwrap();
        view.status
            .and_then(|status| project_status(status, &tree(paths), Depth::Bounded).unwrap())
    }

    #[test]
    fn the_projection_holds_the_read_paths_and_their_parents_only() {
        let object = json!({"spec": {"x": 1}, "status": {
            "a": {"b": {"deep": [1, 2]}, "c": 3}, "s": "text", "n": null, "l": [1], "other": {"k": 1}}});
        assert_eq!(
            project(object.clone(), &["a.b", "s.x", "n.y", "l.z", "missing.q"]),
            Some(json!({"a": {"b": {"deep": [1, 2]}}, "s": false, "n": null, "l": false}))
        );
        assert_eq!(project(object, &[]), Some(json!({})));
        assert_eq!(project(json!({"status": null}), &["a"]), None);
        assert_eq!(project(json!({"spec": {}}), &["a"]), None);
        assert_eq!(project(json!({"status": 7}), &["a"]), Some(json!(false)));
    }

    #[test]
    fn deep_values_outside_the_read_paths_are_skipped_at_any_depth() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        let text = format!(r#"{{"spec": {deep}, "status": {{"other": {deep}, "a": 1}}}}"#);
        let view: ObjectView<'_> = serde_json::from_str(&text).unwrap();
        let status = project_status(view.status.unwrap(), &tree(&["a"]), Depth::Bounded).unwrap();
        assert_eq!(status, Some(json!({"a": 1})));
    }

    #[test]
    fn a_deep_read_value_asks_for_the_unbounded_parse() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let text = format!(r#"{{"a": {deep}}}"#);
        let raw: &RawValue = serde_json::from_str(&text).unwrap();
        assert!(matches!(
            project_status(raw, &tree(&["a"]), Depth::Bounded),
            Err(ProjectError::TooDeep)
        ));
        let status = project_status(raw, &tree(&["a"]), Depth::Unbounded).unwrap().unwrap();
        assert_eq!(nesting_depth(&text), 201);
        crate::ownership::drop_iteratively(status);
    }

    #[test]
    fn conditions_of_types_nobody_owns_are_kept_in_place_unread() {
        let conditions = FieldPath::parse("conditions").unwrap();
        let tree = PathTree::with_conditions([], &conditions, ["Ready".to_owned()]);
        let text =
            r#"{"conditions": [{"type": "Other", "x": 1}, {"type": "Ready", "m": null}, 5, {"type": "Re\u0061dy"}]}"#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        assert_eq!(
            project_status(raw, &tree, Depth::Bounded).unwrap(),
            Some(json!({"conditions": [null, {"type": "Ready", "m": null}, null, {"type": "Ready"}]}))
        );
        // A deep owned condition asks for the unbounded parse too.
        let deep = format!(
            r#"{{"conditions": [{{"type": "Ready", "d": {}1{}}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let raw: &RawValue = serde_json::from_str(&deep).unwrap();
        assert!(matches!(
            project_status(raw, &tree, Depth::Bounded),
            Err(ProjectError::TooDeep)
        ));
        let status = project_status(raw, &tree, Depth::Unbounded).unwrap().unwrap();
        crate::ownership::drop_iteratively(status);
    }

    /// Values of the same text are left out of both statuses, and never
    /// built: a deep one needs no unbounded parse. A changed value, and
    /// each condition type whose items changed, are built on both sides.
    #[test]
    fn the_same_text_is_left_out_of_both_statuses_and_never_built() {
        let conditions = FieldPath::parse("conditions").unwrap();
        let paths: Vec<FieldPath> = ["a.b", "a.c", "d", "big"]
            .iter()
            .map(|p| FieldPath::parse(p).unwrap())
            .collect();
        let tree = PathTree::with_conditions(paths.iter(), &conditions, ["Ready".to_owned(), "Scaled".to_owned()]);
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        let old = format!(
            r#"{{"a": {{"b": 1, "c": [1]}}, "d": null, "big": {deep}, "conditions": [{{"type": "Ready", "s": 1}}, {{"type": "Scaled", "s": 1}}, {{"type": "Other"}}]}}"#
        );
        let new = format!(
            r#"{{"a": {{"b": 1, "c": [2]}}, "big": {deep}, "conditions": [{{"type": "Ready", "s": 1}}, {{"type": "Scaled", "s": 2}}]}}"#
        );
        let (old, new): (&RawValue, &RawValue) =
            (serde_json::from_str(&old).unwrap(), serde_json::from_str(&new).unwrap());
        let captured = |raw| capture_status(raw, &tree, None, Depth::Bounded).unwrap();
        let statuses = realize(Some(captured(old)), Some(captured(new)), Depth::Bounded, Proofs::Off).unwrap();
        assert_eq!(
            statuses.old,
            Some(Some(
                json!({"a": {"c": [1]}, "d": null, "conditions": [null, {"type": "Scaled", "s": 1}, null]})
            ))
        );
        assert_eq!(
            statuses.new,
            Some(Some(
                json!({"a": {"c": [2]}, "conditions": [null, {"type": "Scaled", "s": 2}]})
            ))
        );
        // A changed deep value still asks for the unbounded parse.
        let changed = format!(r#"{{"big": {}}}"#, deep.replace("1]", "2]"));
        let changed: &RawValue = serde_json::from_str(&changed).unwrap();
        assert!(matches!(
            realize(
                Some(captured(old)),
                Some(captured(changed)),
                Depth::Bounded,
                Proofs::Off
            ),
            Err((Side::Old | Side::New, ProjectError::TooDeep))
        ));
    }

    /// Issue 25: asked to prove, `realize` leaves out unbuilt the items of
    /// a type whose fingerprints differ and names the type; items of equal
    /// value in other text, and any doubt, are built and compared as before.
    #[test]
    fn items_proven_changed_by_their_fingerprints_are_named_and_never_built() {
        let conditions = FieldPath::parse("conditions").unwrap();
        let types = ["Ready", "Scaled", "Twice", "Gone", "Same"].map(str::to_owned);
        let tree = PathTree::with_conditions(std::iter::empty(), &conditions, types);
        let old = r#"{"conditions": [
            {"type": "Ready", "s": 1}, {"type": "Scaled", "s": 1, "x": null},
            {"type": "Twice", "s": 1}, {"type": "Gone"}, {"type": "Gone"}, {"type": "Same"}]}"#;
        let new = r#"{"conditions": [
            {"type": "Ready", "s": 2}, {"s": 1, "type": "Scaled"},
            {"type": "Twice", "s": 3, "s": 1}, {"type": "Gone"}, {"type": "Same"}]}"#;
        let (old, new): (&RawValue, &RawValue) =
            (serde_json::from_str(old).unwrap(), serde_json::from_str(new).unwrap());
        let captured = |raw| capture_status(raw, &tree, None, Depth::Bounded).unwrap();
        let realized = |proofs| {
            let budget = 1 << 30;
            let _guard = ValueBudget::enter(budget);
            let statuses = realize(Some(captured(old)), Some(captured(new)), Depth::Bounded, proofs).unwrap();
            (statuses, budget - ValueBudget::left().unwrap())
        };
        let ((proven, proven_spent), (built, built_spent)) = (realized(Proofs::Names), realized(Proofs::Off));
        // Ready changed its value, Gone its number of items: proven, unbuilt.
        assert_eq!(proven.changed.of(&conditions).collect::<Vec<_>>(), ["Gone", "Ready"]);
        assert_eq!(
            proven.old,
            Some(Some(json!({"conditions": [
                null, {"type": "Scaled", "s": 1, "x": null}, {"type": "Twice", "s": 1}, null, null, null]})))
        );
        // Scaled is the same value in other text, Twice has a key written
        // twice (a parse keeps the last): both are built, as without proofs.
        assert_eq!(
            proven.new,
            Some(Some(
                json!({"conditions": [null, {"s": 1, "type": "Scaled"}, {"type": "Twice", "s": 1}, null, null]})
            ))
        );
        assert_eq!(built.changed, ChangedGroups::default());
        assert_eq!(
            built.new.unwrap().unwrap()["conditions"][0],
            json!({"type": "Ready", "s": 2})
        );
        // Left unbuilt, they spend nothing: the rest spends as before.
        assert_eq!(built_spent - proven_spent, 102, "the Ready and Gone items built");
    }

    /// For a restore, the old items of a group proven changed are kept as
    /// their text, as read (numbers, nested values and their spacing
    /// untouched), and never built: the text is what building gives, of
    /// duplicate keys the last, and it spends from the review's budget.
    #[test]
    fn a_restore_keeps_the_old_items_as_their_text() {
        let conditions = FieldPath::parse("conditions").unwrap();
        let tree = PathTree::with_conditions(std::iter::empty(), &conditions, ["Ready".to_owned()]);
        let old = r#"{"conditions": [
            {"type": "Ready", "n": 1.0e1, "s": "\u0041", "s": "B", "t\u0065xt": [1, {"a": 2}]},
            {"type": "Ready"}]}"#;
        let new = r#"{"conditions": [{"type": "Ready", "n": 2}]}"#;
        let (old, new): (&RawValue, &RawValue) =
            (serde_json::from_str(old).unwrap(), serde_json::from_str(new).unwrap());
        let captured = |raw| capture_status(raw, &tree, None, Depth::Bounded).unwrap();
        let realized = |proofs| {
            let budget = 1 << 30;
            let _guard = ValueBudget::enter(budget);
            let statuses = realize(Some(captured(old)), Some(captured(new)), Depth::Bounded, proofs);
            (statuses, budget - ValueBudget::left().unwrap())
        };
        let (statuses, spent) = realized(Proofs::Restore);
        let statuses = statuses.unwrap();
        let (named, named_spent) = realized(Proofs::Names);
        assert_eq!(named.unwrap().changed.of(&conditions).collect::<Vec<_>>(), ["Ready"]);
        let groups: Vec<_> = statuses.changed.in_list(&conditions).collect();
        assert_eq!(groups.len(), 1);
        let texts: Vec<&str> = groups[0]
            .1
            .old_items
            .iter()
            .map(|t| std::str::from_utf8(t).unwrap())
            .collect();
        assert_eq!(
            texts,
            [
                r#"{"type":"Ready","n":1.0e1,"s":"B","text":[1, {"a": 2}]}"#,
                r#"{"type":"Ready"}"#
            ]
        );
        let first: Value = serde_json::from_str(texts[0]).unwrap();
        assert_eq!(
            first,
            json!({"type": "Ready", "n": 10.0, "s": "B", "text": [1, {"a": 2}]})
        );
        assert_eq!(groups[0].1.new_items, [(0, false)]);
        for status in [&statuses.old, &statuses.new] {
            let items = status.clone().unwrap().unwrap()["conditions"].clone();
            assert!(items.as_array().unwrap().iter().all(Value::is_null), "nothing is built");
        }
        // The text held is what a restore spends beyond naming the group.
        let held: usize = texts.iter().map(|t| t.len()).sum();
        assert!(spent - named_spent >= held, "{spent} - {named_spent} < {held}");
        // What building refuses is refused, not copied into a patch: a
        // number beyond a double's range, a lone surrogate.
        for unreadable in [r#"1e400"#, r#""\ud800""#, r#"[{"a": -1e999}]"#, r#"1e400, "x": 1"#] {
            let old = format!(r#"{{"conditions": [{{"type": "Ready", "n": 1, "x": {unreadable}}}]}}"#);
            let old: &RawValue = serde_json::from_str(&old).unwrap();
            let with = |proofs| {
                let old = capture_status(old, &tree, None, Depth::Bounded).unwrap();
                realize(Some(old), Some(captured(new)), Depth::Bounded, proofs)
            };
            let restored = with(Proofs::Restore);
            assert!(
                matches!(restored, Err((Side::Old, ProjectError::Malformed(_)))),
                "{unreadable}: {restored:?}"
            );
            let built = with(Proofs::Off);
            assert!(
                matches!(built, Err((Side::Old, ProjectError::Malformed(_)))),
                "as building refuses it"
            );
        }
    }

    /// A writer's own values are never compared on its writes: they are
    /// skipped unread, whatever they hold; the others' are read.
    #[test]
    fn the_writers_own_values_are_skipped_unread() {
        let rules = crate::ownership::Ownership::from_yaml(
            "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nresources:\n  - group: g\n    resource: r\n    lists: [{path: parents, key: c}]\n    writers:\n      - {user: a, fields: [mine], conditions: [A], entries: {parents: [a]}}\n      - {user: b, fields: [theirs], conditions: [B], entries: {parents: [b]}}\n",
        )
        .unwrap();
        let r = rules.resource("g", "r").unwrap();
        let text = r#"{"mine": {"x": [1]}, "theirs": 2, "conditions": [{"type": "A"}, {"type": "B"}],
                       "parents": [{"c": "a"}, {"c": "b"}, {"c": "nobody"}]}"#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let captured = capture_status(raw, &r.read_paths, r.writer_position("a"), Depth::Bounded)
            .unwrap()
            .unwrap();
        assert_eq!(
            build(&captured, Depth::Bounded).unwrap(),
            json!({"theirs": 2, "conditions": [null, {"type": "B"}], "parents": [null, {"c": "b"}, null]})
        );
        let everyone = capture_status(raw, &r.read_paths, None, Depth::Bounded)
            .unwrap()
            .unwrap();
        assert_eq!(
            build(&everyone, Depth::Bounded).unwrap(),
            json!({"mine": {"x": [1]}, "theirs": 2, "conditions": [{"type": "A"}, {"type": "B"}],
                   "parents": [{"c": "a"}, {"c": "b"}, null]})
        );
    }

    /// What the reader holds for captured text is counted as built values
    /// are: 8 MiB of owned items the same in both objects is refused as too
    /// large, not held (each slot is many times its text).
    #[test]
    fn captured_items_spend_from_the_review_budget() {
        let _budget = crate::value_budget::ValueBudget::enter(crate::value_budget::REVIEW_VALUE_BUDGET);
        let conditions = FieldPath::parse("conditions").unwrap();
        let tree = PathTree::with_conditions([], &conditions, ["A".to_owned()]);
        let text = format!(
            r#"{{"conditions": [{}{{"type":"A"}}]}}"#,
            r#"{"type":"A"},"#.repeat(600_000)
        );
        let raw: &RawValue = serde_json::from_str(&text).unwrap();
        assert!(matches!(
            capture_status(raw, &tree, None, Depth::Bounded),
            Err(ProjectError::TooLarge)
        ));
    }

    /// A value's text among a few that share values in other text
    /// (`1` and `1.0`, escapes, member order, nulls), nest, or cannot be
    /// built (`1e400`).
    fn member_value() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec![
            "1",
            "1.0",
            "2",
            "null",
            r#""x""#,
            r#""\u0078""#,
            r#"[1,{"a":null}]"#,
            "[1,{}]",
            r#"{"b":1,"c":2}"#,
            r#"{"c":2,"b":1}"#,
            "1e400",
        ])
    }

    /// An item's members after its `type`: keys from a few, so that some
    /// are written twice.
    fn item_members() -> impl proptest::strategy::Strategy<Value = Vec<(&'static str, &'static str)>> {
        use proptest::prelude::*;
        prop::collection::vec((prop::sample::select(vec!["s", "m", "n"]), member_value()), 0..4)
    }

    fn item_text_of(ty: &str, members: &[(&str, &str)]) -> String {
        let members: String = members.iter().map(|(k, v)| format!(r#","{k}":{v}"#)).collect();
        format!(r#"{{"type":"{ty}"{members}}}"#)
    }

    proptest::proptest! {
        // Cheap cases, and the ones that tell the two apart (a first
        // difference of equal value before another) are rare: many.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// Lists whose items keep their places, each key once (the usual
        /// write), are left out by index exactly as grouping by key leaves
        /// them out: the same items, the same groups named, the same old
        /// items' text for a restore, the same error.
        #[test]
        fn aligned_lists_are_left_out_as_grouping_leaves_them(
            items in proptest::collection::vec(
                (proptest::sample::select(vec!["A", "B", "C", "D", "E"]), item_members(),
                 proptest::option::of(item_members()), proptest::collection::vec((0..4usize, member_value()), 0..3)),
                0..6,
            ),
        ) {
            // A new item is its old one, other members, or (most often) the
            // old one with some values replaced.
            let items: Vec<_> = items
                .into_iter()
                .map(|(ty, old, other, replaced)| {
                    let new = other.or_else(|| {
                        let mut new = old.clone();
                        for (at, value) in &replaced {
                            if let Some(member) = new.get_mut(*at) {
                                member.1 = value;
                            }
                        }
                        (!replaced.is_empty()).then_some(new)
                    });
                    (ty, old, new)
                })
                .collect();
            let conditions = FieldPath::parse("conditions").unwrap();
            // `E` is nobody's: its items are not read.
            let tree = PathTree::with_conditions([], &conditions, ["A", "B", "C", "D"].map(str::to_owned));
            let mut seen = BTreeSet::new();
            let items: Vec<_> = items.into_iter().filter(|(ty, _, _)| seen.insert(*ty)).collect();
            let list = |new: bool| {
                let texts: Vec<String> = items
                    .iter()
                    .map(|(ty, old, changed)| item_text_of(ty, if new { changed.as_ref().unwrap_or(old) } else { old }))
                    .collect();
                format!(r#"{{"conditions":[{}]}}"#, texts.join(","))
            };
            let (old_text, new_text) = (list(false), list(true));
            let (old_raw, new_raw): (&RawValue, &RawValue) =
                (serde_json::from_str(&old_text).unwrap(), serde_json::from_str(&new_text).unwrap());
            let captured = |raw| match capture_status(raw, &tree, None, Depth::Bounded).unwrap() {
                Some(Captured::Object(mut members)) => match members.pop() {
                    Some((_, Captured::Items(items))) => items,
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            };
            let (old, new) = (captured(old_raw), captured(new_raw));
            proptest::prop_assert!(aligned(&old, &new));
            // Moved, missing or doubled keys are left to grouping.
            let read: Vec<_> = old.iter().filter(|item| item.is_some()).cloned().collect();
            if read.len() >= 2 {
                let mut moved = read.clone();
                moved.rotate_left(1);
                proptest::prop_assert!(!aligned(&read, &moved));
                proptest::prop_assert!(!aligned(&read, &read[1..]));
                let doubled = [read.clone(), read.clone()].concat();
                proptest::prop_assert!(!aligned(&doubled, &doubled));
            }
            for restore in [None, Some(false), Some(true)] {
                let proving = || restore.map(|restore| Proving { path: vec!["conditions".to_owned()], restore, ..Proving::default() });
                let (mut by_index_proving, mut by_key_proving) = (proving(), proving());
                let by_index = aligned_left_out(&old, &new, Depth::Bounded, by_index_proving.as_mut());
                let by_key = grouped_left_out(&old, &new, Depth::Bounded, by_key_proving.as_mut());
                match (by_index, by_key) {
                    (Ok(by_index), Ok(by_key)) => {
                        let by_key: Vec<bool> = old
                            .iter()
                            .map(|item| item.as_ref().is_some_and(|item| by_key.contains(item.key.as_ref())))
                            .collect();
                        proptest::prop_assert_eq!(by_index, by_key, "{:?}", restore);
                    }
                    (Err((a, _)), Err((b, _))) => proptest::prop_assert_eq!(a, b),
                    (a, b) => proptest::prop_assert!(false, "{:?}: {:?} against {:?}", restore, a, b),
                }
                proptest::prop_assert_eq!(
                    by_index_proving.map(|p| p.changed),
                    by_key_proving.map(|p| p.changed),
                    "{:?}", restore
                );
            }
        }
    }

    #[test]
    fn nesting_depth_skips_brackets_in_strings() {
        assert_eq!(nesting_depth(r#"{"a": "[[[{{\"]]", "b": [[1]]}"#), 3);
        assert_eq!(nesting_depth("1"), 0);
    }
}
