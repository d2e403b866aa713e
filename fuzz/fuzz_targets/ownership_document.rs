//! Any text as an ownership document (or a ConfigMap manifest holding one):
//! never a panic, and a document that loads keeps the rules' promises.
#![no_main]

use libfuzzer_sys::fuzz_target;
use statusguard::rules::parse_document;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(rules) = parse_document("fuzz", text) else {
        return;
    };
    for resource in rules.resources() {
        assert!(rules.resource(&resource.group, &resource.resource).is_some());
        for (i, a) in resource.writers.iter().enumerate() {
            assert!(!a.username.is_empty());
            for field in &a.fields {
                assert!(
                    !field.overlaps(&resource.conditions_path),
                    "a field overlaps the conditions"
                );
            }
            for b in &resource.writers[i + 1..] {
                assert_ne!(a.username, b.username);
                for p in &a.fields {
                    assert!(!b.fields.iter().any(|q| p.overlaps(q)), "two owners of {p}");
                }
                assert!(!a.conditions.iter().any(|c| b.conditions.contains(c)));
            }
        }
    }
});
