//! The one recorder of every Kubernetes Event the server sends: invalid
//! ownership documents ([`super::config_watch`]) and denied or trimmed
//! writes ([`super::observer`]).
//!
//! One kube-runtime [`Recorder`] under one [`Reporter`] (`statusguard`, the
//! pod's name as instance): repeats of an Event become one Event whose
//! series counts them, whichever loop sent it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Recorder, Reporter};

/// An Event note holds at most 1 kB.
const NOTE_BYTES: usize = 1000;

/// Sends Events; clones share the recorder's series.
#[derive(Clone)]
pub struct Events {
    client: Client,
    recorder: Recorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Events")
    }
}

impl Events {
    pub fn new(client: Client) -> Self {
        let reporter = Reporter {
            controller: "statusguard".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
        }
    }

    /// The client the Events go through, for what must be read before one
    /// is sent.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        self.recorder.publish(event, regarding).await
    }
}

/// `note` cut to what an Event holds, on a character boundary, with `...`
/// where it was cut (the Events API refuses a longer note).
pub fn note(mut note: String) -> String {
    if note.len() > NOTE_BYTES {
        let mut cut = NOTE_BYTES - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_on_a_character_boundary() {
        let cut = note("é".repeat(600));
        assert!(cut.len() <= 1000 && cut.ends_with("..."), "{}", cut.len());
        assert_eq!(note("short".into()), "short");
    }
}
