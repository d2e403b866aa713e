//! `statusguard suggest`: a draft ownership document from the cluster as it
//! is. Each object's `managedFields` say which field manager set which
//! status field and condition type through the status subresource; the
//! webhook's record of observed writes (`GET /observed`) says which
//! identity did. Field managers are names clients choose; identities are
//! what the webhook enforces, so the draft uses identities where the record
//! maps a manager to one, and otherwise names the manager for a human to map.
//!
//! Pure: the command line fetches the objects and the records.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::admission::observe::{OTHER_IDENTITY, OTHER_ITEM, ObservedWriters, ResourceRecord, is_cut};
use crate::ownership::Item;
use crate::ownership::{FieldPath, Ownership, OwnershipError};
use managed_fields::ObjectFields;

/// Who set an item, across the objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Setters {
    /// By writer (an identity, or a field manager): the objects it set the item on.
    pub by_writer: BTreeMap<String, Vec<String>>,
    /// The field managers that set it.
    pub managers: BTreeSet<String>,
}

/// The draft: the resource's writers, and where they collide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    pub group: String,
    pub resource: String,
    /// Where the conditions list lives below `.status`.
    pub conditions_key: String,
    pub objects: usize,
    /// Item to who set it.
    pub items: BTreeMap<Item, Setters>,
    /// Field manager to the identity it runs as, where the record tells.
    pub identities: BTreeMap<String, String>,
    /// Managers that wrote an atomic conditions list.
    pub atomic_conditions: BTreeSet<String>,
    /// Lists whose entries different writers write, split by one member.
    pub lists: Vec<KeyedDraft>,
    /// Lists of objects owned whole (atomic), to the managers holding them:
    /// managedFields cannot say who writes which entry.
    pub atomic_lists: BTreeMap<FieldPath, BTreeSet<String>>,
    /// Some observed record used does not say its callers were
    /// authenticated: its identities may be forged.
    pub observed_unauthenticated: bool,
}

/// A keyed list the draft declares (`lists:`), and who gets which entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedDraft {
    /// The list's path below `.status`.
    pub path: FieldPath,
    /// The member whose value says whose an entry is.
    pub key: String,
    /// Writer to the key value only it wrote: its `entries:`.
    pub owners: BTreeMap<String, String>,
    /// Key values that more than one writer wrote, to those writers: a key
    /// value has one owner per list, and the draft does not pick one.
    pub shared: BTreeMap<String, BTreeSet<String>>,
}

/// Who wrote which entries: list path to member to writer to the values of
/// that member in the entries it wrote.
type EntryEvidence = BTreeMap<FieldPath, BTreeMap<String, BTreeMap<String, BTreeSet<String>>>>;

/// The keyed lists the evidence shows. A list's key is the member
/// (`controllerName` first, then the others by name) that at least two
/// writers wrote and that has, for every one of them, exactly one value no
/// other writer wrote: the value is constant per writer and differs between
/// writers. Values more than one writer wrote (a rollback by one writer of
/// another's entry, a take-over) are left unowned and said.
fn keyed_lists(evidence: &EntryEvidence) -> Vec<KeyedDraft> {
    let mut lists = Vec::new();
    for (path, members) in evidence {
        let preferred = members.get_key_value("controllerName");
        let others = members.iter().filter(|(m, _)| m.as_str() != "controllerName");
        for (member, writers) in preferred.into_iter().chain(others) {
            if writers.len() < 2 {
                continue;
            }
            let mut writers_of: BTreeMap<&String, BTreeSet<String>> = BTreeMap::new();
            for (writer, values) in writers {
                for value in values {
                    writers_of.entry(value).or_default().insert(writer.clone());
                }
            }
            let owners: BTreeMap<String, String> = writers
                .iter()
                .filter_map(|(writer, values)| {
                    let own: Vec<&String> = values.iter().filter(|v| writers_of[v].len() == 1).collect();
                    match own[..] {
                        [value] => Some((writer.clone(), value.clone())),
                        _ => None,
                    }
                })
                .collect();
            if owners.len() == writers.len() {
                lists.push(KeyedDraft {
                    path: path.clone(),
                    key: member.clone(),
                    owners,
                    shared: writers_of
                        .into_iter()
                        .filter(|(_, w)| w.len() > 1)
                        .map(|(v, w)| (v.clone(), w))
                        .collect(),
                });
                break;
            }
        }
    }
    lists
}

/// The items each identity changed, from the observed records (several
/// replicas' records are summed).
fn observed_items(records: &[&ResourceRecord]) -> BTreeMap<String, BTreeMap<Item, u64>> {
    let mut by_identity: BTreeMap<String, BTreeMap<Item, u64>> = BTreeMap::new();
    for record in records {
        for writer in &record.writers {
            // A cut name is no identity or item anyone could own.
            if writer.identity == OTHER_IDENTITY || is_cut(&writer.identity) {
                continue;
            }
            let items = by_identity.entry(writer.identity.clone()).or_default();
            for (path, n) in &writer.fields {
                if path != OTHER_ITEM
                    && !is_cut(path)
                    && let Ok(field) = FieldPath::parse(path)
                {
                    *items.entry(Item::Field(field)).or_default() += n;
                }
            }
            for (ty, n) in &writer.conditions {
                if ty != OTHER_ITEM && !is_cut(ty) {
                    *items.entry(Item::Condition(ty.clone())).or_default() += n;
                }
            }
            for (list, members) in &writer.entries {
                let Ok(list) = FieldPath::parse(list) else {
                    continue;
                };
                for (key, values) in members.iter().filter(|(k, _)| !is_cut(k)) {
                    for (value, n) in values.iter().filter(|(v, _)| !is_cut(v)) {
                        let entry = Item::Entry {
                            list: list.clone(),
                            key: key.clone(),
                            value: value.clone(),
                        };
                        *items.entry(entry).or_default() += n;
                    }
                }
            }
        }
    }
    by_identity
}

/// Whether an observed item covers a managed one: the same condition type,
/// or a field path that is the managed one or one of its parents.
fn covers(observed: &Item, managed: &Item) -> bool {
    match (observed, managed) {
        (Item::Condition(a), Item::Condition(b)) => a == b,
        (Item::Field(a), Item::Field(b)) => b.is_within(a),
        (a @ Item::Entry { .. }, b) => a == b,
        _ => false,
    }
}

/// Builds the draft of one resource from its objects' fields and the
/// observed records (of any resources: this one's are picked).
pub fn draft(
    group: &str,
    resource: &str,
    conditions_key: &str,
    objects: &[ObjectFields],
    observed: &[ObservedWriters],
) -> Draft {
    let records: Vec<&ResourceRecord> = observed
        .iter()
        .flat_map(|o| &o.resources)
        .filter(|r| r.group == group && r.resource == resource)
        .collect();
    let by_identity = observed_items(&records);

    // Each manager's items across the objects.
    let mut manager_items: BTreeMap<String, BTreeSet<Item>> = BTreeMap::new();
    for object in objects {
        for (manager, items) in object.managers.iter().chain(&object.entries) {
            manager_items
                .entry(manager.clone())
                .or_default()
                .extend(items.iter().cloned());
        }
    }
    // A manager runs as the identity whose observed writes cover most of its
    // items. Where several cover as many (two implementations that both
    // wrote an atomic list the manager holds whole), the records cannot
    // tell which: the manager stays named.
    let mut identities = BTreeMap::new();
    for (manager, items) in &manager_items {
        let scores: Vec<(usize, &String)> = by_identity
            .iter()
            .map(|(identity, seen)| {
                let score = items.iter().filter(|m| seen.keys().any(|o| covers(o, m))).count();
                (score, identity)
            })
            .filter(|(score, _)| *score > 0)
            .collect();
        let best = scores.iter().map(|(score, _)| *score).max().unwrap_or_default();
        if let [(_, identity)] = scores.iter().filter(|(score, _)| *score == best).collect::<Vec<_>>()[..] {
            identities.insert(manager.clone(), (*identity).clone());
        }
    }
    let writer_of = |manager: &str| identities.get(manager).cloned().unwrap_or_else(|| manager.to_owned());

    let mut items: BTreeMap<Item, Setters> = BTreeMap::new();
    for object in objects {
        for (manager, managed) in &object.managers {
            for item in managed {
                let setters = items.entry(item.clone()).or_default();
                setters.managers.insert(manager.clone());
                let on = setters.by_writer.entry(writer_of(manager)).or_default();
                if !on.contains(&object.object) {
                    on.push(object.object.clone());
                }
            }
        }
    }
    // Identities seen changing items that no field manager holds (their
    // writes were rolled back since, or denied): they set them too.
    for (identity, seen) in &by_identity {
        // Entries are drafted as keyed lists, below.
        for item in seen.keys().filter(|i| !matches!(i, Item::Entry { .. })) {
            let held = items.keys().any(|managed| covers(item, managed));
            if !held {
                items
                    .entry(item.clone())
                    .or_default()
                    .by_writer
                    .entry(identity.clone())
                    .or_default();
            } else {
                for (managed, setters) in items.iter_mut() {
                    if covers(item, managed) && !setters.by_writer.contains_key(identity) {
                        setters.by_writer.insert(identity.clone(), Vec::new());
                    }
                }
            }
        }
    }
    let atomic_conditions = objects
        .iter()
        .flat_map(|o| o.atomic_conditions.iter().cloned())
        .collect();
    // Who wrote which entries: managedFields' keyed lists (by the writer
    // each manager runs as), and the observed writes.
    let mut evidence = EntryEvidence::new();
    let mut note = |writer: String, item: &Item| {
        if let Item::Entry { list, key, value } = item {
            let writers = evidence
                .entry(list.clone())
                .or_default()
                .entry(key.clone())
                .or_default();
            writers.entry(writer).or_default().insert(value.clone());
        }
    };
    for object in objects {
        for (manager, entries) in &object.entries {
            for entry in entries {
                note(writer_of(manager), entry);
            }
        }
    }
    for (identity, seen) in &by_identity {
        for item in seen.keys() {
            note(identity.clone(), item);
        }
    }
    let lists = keyed_lists(&evidence);
    let mut atomic_lists: BTreeMap<FieldPath, BTreeSet<String>> = BTreeMap::new();
    for object in objects {
        for (list, managers) in &object.atomic_lists {
            atomic_lists
                .entry(list.clone())
                .or_default()
                .extend(managers.iter().cloned());
        }
    }
    Draft {
        group: group.to_owned(),
        resource: resource.to_owned(),
        conditions_key: conditions_key.to_owned(),
        objects: objects.len(),
        items,
        identities,
        atomic_conditions,
        lists,
        atomic_lists,
        observed_unauthenticated: observed.iter().any(|o| !o.authenticated()),
    }
}

impl Draft {
    /// Items set by more than one writer or field manager: where rollbacks
    /// happen today.
    pub fn contested(&self) -> Vec<(&Item, &Setters)> {
        self.items
            .iter()
            .filter(|(item, s)| (s.by_writer.len() > 1 || s.managers.len() > 1) && !self.in_keyed_list(item))
            .collect()
    }

    /// Whether an item is (within) a list the draft keys: its entries are
    /// owned by key value, never as a field.
    fn in_keyed_list(&self, item: &Item) -> bool {
        matches!(item, Item::Field(path) if self.lists.iter().any(|l| path.overlaps(&l.path)))
    }

    /// Who the draft gives an item to: the writer that set it on the most
    /// objects (then the one first by name).
    fn owner_of(setters: &Setters) -> Option<&String> {
        setters
            .by_writer
            .iter()
            .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(a.0)))
            .map(|(writer, _)| writer)
    }

    /// Fields whose leaves all went to one writer are owned whole, at the
    /// top: the leaves are named only where writers split an object.
    fn owned(&self) -> BTreeMap<String, (BTreeSet<FieldPath>, BTreeSet<String>)> {
        let mut by_top: BTreeMap<&str, BTreeMap<&FieldPath, String>> = BTreeMap::new();
        let mut owned: BTreeMap<String, (BTreeSet<FieldPath>, BTreeSet<String>)> = BTreeMap::new();
        for (item, setters) in &self.items {
            let Some(owner) = Self::owner_of(setters).filter(|_| !self.in_keyed_list(item)) else {
                continue;
            };
            match item {
                Item::Condition(ty) => {
                    owned.entry(owner.clone()).or_default().1.insert(ty.clone());
                }
                Item::Field(path) => {
                    let top = path.segments().first().map_or("", String::as_str);
                    by_top.entry(top).or_default().insert(path, owner.clone());
                }
                // Drafted as keyed lists (`self.lists`), never as items.
                Item::Entry { .. } => {}
            }
        }
        for (top, leaves) in by_top {
            let owners: BTreeSet<&String> = leaves.values().collect();
            if let [owner] = owners.into_iter().collect::<Vec<_>>()[..]
                && let Ok(top) = FieldPath::parse(top)
            {
                owned.entry(owner.clone()).or_default().0.insert(top);
            } else {
                for (path, owner) in leaves {
                    owned.entry(owner).or_default().0.insert(path.clone());
                }
            }
        }
        owned
    }

    /// This resource's entry of the document (YAML under `resources:`).
    fn render_resource(&self, text: &mut String) {
        let _ = writeln!(text, "  - group: {}", yaml_string(&self.group));
        let _ = writeln!(text, "    resource: {}", yaml_string(&self.resource));
        let _ = writeln!(text, "    conditions: {}", yaml_string(&self.conditions_key));
        self.render_lists(text);
        let owned = self.owned();
        // Writer to its entries: list path to its key value.
        let mut entries: BTreeMap<&String, Vec<(&FieldPath, &String)>> = BTreeMap::new();
        for list in &self.lists {
            for (writer, value) in &list.owners {
                entries.entry(writer).or_default().push((&list.path, value));
            }
        }
        let writers: BTreeSet<&String> = owned.keys().chain(entries.keys().copied()).collect();
        let none = (BTreeSet::new(), BTreeSet::new());
        if writers.is_empty() {
            *text += "    writers: []\n";
        } else {
            *text += "    writers:\n";
        }
        let contested: BTreeSet<&Item> = self.contested().into_iter().map(|(i, _)| i).collect();
        let marks = |text: &mut String, marked: Vec<String>| {
            if !marked.is_empty() {
                let _ = write!(text, "  # contested: {}", marked.join(", "));
            }
            *text += "\n";
        };
        for writer in writers {
            let (fields, conditions) = owned.get(writer).unwrap_or(&none);
            let managers: Vec<&String> = self
                .identities
                .iter()
                .filter(|(_, identity)| *identity == writer)
                .map(|(manager, _)| manager)
                .collect();
            let is_manager = !self.identities.values().any(|i| i == writer) && self.items_set_by_manager(writer);
            match writer
                .strip_prefix("system:serviceaccount:")
                .and_then(|r| r.split_once(':'))
            {
                Some((namespace, name)) => {
                    let _ = write!(
                        text,
                        "      - serviceAccount: {}",
                        yaml_string(&format!("{namespace}/{name}"))
                    );
                    if !managers.is_empty() {
                        let names: Vec<String> = managers.iter().map(|m| format!("{m:?}")).collect();
                        let _ = write!(text, "  # field manager {}", names.join(", "));
                    }
                    *text += "\n";
                }
                None if is_manager => {
                    let _ = writeln!(
                        text,
                        "      # field manager {writer:?}: no observed identity; replace with its serviceAccount: NAMESPACE/NAME or user: NAME"
                    );
                    let _ = writeln!(text, "      - user: {}", yaml_string(writer));
                }
                None => {
                    let _ = writeln!(text, "      - user: {}", yaml_string(writer));
                }
            }
            let list =
                |items: Vec<String>| -> String { items.iter().map(|i| yaml_string(i)).collect::<Vec<_>>().join(", ") };
            if !fields.is_empty() {
                let _ = write!(
                    text,
                    "        fields: [{}]",
                    list(fields.iter().map(ToString::to_string).collect())
                );
                let marked = fields
                    .iter()
                    .filter(|f| contested.iter().any(|c| matches!(c, Item::Field(p) if p.is_within(f))))
                    .map(ToString::to_string)
                    .collect();
                marks(text, marked);
            }
            if !conditions.is_empty() {
                let _ = write!(
                    text,
                    "        conditions: [{}]",
                    list(conditions.iter().cloned().collect())
                );
                let marked = conditions
                    .iter()
                    .filter(|t| contested.contains(&Item::Condition((*t).clone())))
                    .cloned()
                    .collect();
                marks(text, marked);
            }
            if let Some(entries) = entries.get(writer) {
                *text += "        entries:\n";
                for (list, value) in entries {
                    let _ = writeln!(
                        text,
                        "          {}: [{}]",
                        yaml_string(&list.to_string()),
                        yaml_string(value)
                    );
                }
            }
        }
    }

    /// The keyed lists (`lists:`), each with the key values the draft gave
    /// nobody; and, as comments, the lists owned whole, where managedFields
    /// cannot tell who writes which entry.
    fn render_lists(&self, text: &mut String) {
        for (list, managers) in &self.atomic_lists {
            let keyed = self.lists.iter().any(|l| l.path == *list);
            let managers: Vec<String> = managers.iter().map(|m| format!("{m:?}")).collect();
            let _ = writeln!(
                text,
                "    # status.{list} is owned whole (atomic list, by field manager {}): who writes which entry cannot be told from managedFields;",
                managers.join(", ")
            );
            if keyed {
                let _ = writeln!(
                    text,
                    "    # its lists: entry below is drafted from the observed writes."
                );
            } else {
                let _ = writeln!(
                    text,
                    "    # observe writes (statusguard suggest --observed, from a webhook that guards this resource) or declare lists: by hand."
                );
            }
        }
        if self.lists.is_empty() {
            return;
        }
        *text += "    lists:\n";
        for list in &self.lists {
            let _ = writeln!(text, "      - path: {}", yaml_string(&list.path.to_string()));
            let _ = writeln!(text, "        key: {}", yaml_string(&list.key));
            for (value, writers) in &list.shared {
                let writers: Vec<String> = writers.iter().map(|w| format!("{w:?}")).collect();
                let _ = writeln!(
                    text,
                    "        # {} was written by {}: a key value has one owner per list; add it to one writer's entries.",
                    quoted(value),
                    writers.join(" and ")
                );
            }
        }
    }

    fn items_set_by_manager(&self, writer: &str) -> bool {
        self.items.values().any(|s| s.managers.contains(writer))
    }

    /// The contested items, as comments: who set each, on how many objects,
    /// with examples, and who the draft gave it to.
    pub fn report(&self) -> String {
        let mut text = format!(
            "#\n# Contested items of {}: set by more than one writer or field manager, where\n# rollbacks happen today. The draft gives each to the writer that set it on\n# the most objects; decide, then keep one owner.\n",
            self.name()
        );
        let contested = self.contested();
        if contested.is_empty() {
            text += "#   none\n";
        }
        for (item, setters) in contested {
            let owner = Self::owner_of(setters).map(String::as_str).unwrap_or_default();
            let _ = writeln!(text, "#   {item} (drafted for {owner}):");
            for (writer, objects) in &setters.by_writer {
                let examples: Vec<&str> = objects.iter().take(3).map(String::as_str).collect();
                let seen = match objects.len() {
                    0 => "observed writing it (not in managedFields)".to_owned(),
                    n => format!("{n} object(s), e.g. {}", examples.join(", ")),
                };
                let _ = writeln!(text, "#     {writer}: {seen}");
            }
            if setters.managers.len() > 1 {
                let managers: Vec<&str> = setters.managers.iter().map(String::as_str).collect();
                let _ = writeln!(text, "#     field managers: {}", managers.join(", "));
            }
        }
        for manager in &self.atomic_conditions {
            let _ = writeln!(
                text,
                "#   the conditions list is atomic (no listType=map by type): field manager {manager} sets it whole"
            );
        }
        text
    }
}

impl Draft {
    /// `resource.group` (or `resource` for the core group).
    pub fn name(&self) -> String {
        resource_name(&self.group, &self.resource)
    }
}

/// `resource.group`, e.g. `widgets.example.com` (`resource` alone for the
/// core group): how the command line names a resource.
pub fn resource_name(group: &str, resource: &str) -> String {
    match group {
        "" => resource.to_owned(),
        group => format!("{resource}.{group}"),
    }
}

/// The inverse of [`resource_name`]: (group, resource); a name without a
/// dot is a core resource.
pub fn split_resource_name(name: &str) -> (String, String) {
    match name.split_once('.') {
        Some((resource, group)) => (group.to_owned(), resource.to_owned()),
        None => (String::new(), name.to_owned()),
    }
}

/// The drafts as one StatusOwnership document (YAML, in audit mode: roll it
/// out watching, then enforce), followed by the report as comments, so that
/// the whole text is the document. Checked before it is returned.
pub fn render(drafts: &[Draft]) -> Result<String, OwnershipError> {
    let mut text = String::new();
    let names: Vec<String> = drafts
        .iter()
        .map(|d| format!("{} ({} object(s))", d.name(), d.objects))
        .collect();
    let mapped: BTreeSet<&String> = drafts.iter().flat_map(|d| d.identities.keys()).collect();
    let _ = writeln!(
        text,
        "# Drafted by `statusguard suggest` from the managedFields of {}.",
        names.join(", ")
    );
    let _ = writeln!(
        text,
        "# {} field manager(s) mapped to identities by the webhook's observed writes.",
        mapped.len()
    );
    if drafts.iter().any(|d| d.observed_unauthenticated) {
        text += "# The observed writes come from reviews whose callers the webhook did not authenticate (its\n";
        text += "# port asked for no client certificate, or the record does not say): anyone who reached the\n";
        text += "# port could have added writes under any identity. Check each identity below.\n";
    }
    text += "# Review it (every contested item is listed at the end), check it with `statusguard check`,\n";
    text += "# roll it out in audit mode, read the Events and metrics, then set mode: enforce.\n";
    text += "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nmode: audit\n";
    text += "exempt:\n  groups: [\"system:masters\"]\n";
    text += if drafts.is_empty() {
        "resources: []\n"
    } else {
        "resources:\n"
    };
    for draft in drafts {
        draft.render_resource(&mut text);
    }
    for draft in drafts {
        text += &draft.report();
    }
    Ownership::from_yaml(&text)?;
    Ok(text)
}

/// A YAML plain scalar when it is safe, else a double-quoted string.
fn yaml_string(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'))
        && !text.starts_with(['-', '.'])
        && !matches!(text, "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "~")
        && text.parse::<f64>().is_err();
    if plain { text.to_owned() } else { quoted(text) }
}

/// A YAML double-quoted string that reads back as `text` whatever it holds:
/// printable ASCII as it is (but `"` and `\` escaped), every other
/// character as its code point (`\uXXXX`, `\UXXXXXXXX`). Key values such as
/// Gateway API's controllerNames may hold `=`, `,`, `;`, `:` and `'`, and
/// a YAML reader must not take a line or a flow sequence to end inside one.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08X}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

pub mod fetch;
pub mod managed_fields;
#[cfg(test)]
mod tests;
