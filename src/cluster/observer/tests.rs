use proptest::prelude::*;
use serde_json::{Value, json};

use super::event_sender::*;
use super::*;
use crate::test_support::{body, widget_status_review};
use axum::body::Bytes;

use crate::admission::answer::{answer_observing, read_and_decide};
use crate::admission::decide::{Endpoint, Outcome};
use crate::admission::observe::WriteFacts;

fn rules() -> Arc<Ownership> {
    Arc::new(Ownership::from_yaml(include_str!("../../../tests/fixtures/ownership.yaml")).unwrap())
}

/// The scaler's stale write of a Widget: it changes the controller's
/// observedGeneration (denied in enforce mode). `filler` bytes of
/// managedFields beside the status make the body large, the statuses not.
fn stale_review(filler: usize, status_filler: usize) -> Vec<u8> {
    let mut review = widget_status_review(
        "system:serviceaccount:platform:widget-scaler",
        json!({"observedGeneration": 2, "replicas": 3}),
        json!({"observedGeneration": 1, "replicas": 3, "unlisted": "y".repeat(status_filler)}),
    );
    review["request"]["object"]["metadata"]["managedFields"][0]["manager"] = json!("x".repeat(filler));
    body(&review)
}

/// The write as the request path copies it out for the observer.
fn copied(rules: &Ownership, body: &[u8]) -> Copied {
    answer_observing(Some(rules), body, Endpoint::Validate, true).1
}

fn decision(rules: &Ownership, body: &[u8]) -> Decision {
    let (_, decided) = read_and_decide(rules, body, Endpoint::Validate).unwrap();
    decided.unwrap()
}

fn counter(metrics: &Metrics, series: &str) -> Option<f64> {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn a_service_account_writer_is_the_related_object() {
    let sa = writer_reference("system:serviceaccount:platform:widget-scaler").unwrap();
    assert_eq!(
        (sa.kind.as_deref(), sa.namespace.as_deref(), sa.name.as_deref()),
        (Some("ServiceAccount"), Some("platform"), Some("widget-scaler"))
    );
    assert!(writer_reference("alice@example.com").is_none());
    assert!(writer_reference("system:serviceaccount:nocolon").is_none());
    // Not names a ServiceAccount can have: no related object.
    assert!(writer_reference("system:serviceaccount:Platform:scaler").is_none());
    assert!(writer_reference(&format!("system:serviceaccount:{}:scaler", "a".repeat(64))).is_none());
    assert!(writer_reference("system:serviceaccount:platform:a/b").is_none());
}

#[test]
fn only_names_that_could_exist_go_into_the_objects_url() {
    for good in ["w1", "a.b-c", "system:controller:x", "x@y"] {
        assert!(is_object_name(good), "{good}");
    }
    for bad in ["", ".", "..", "a/b", "a%2f", "a?b", "a#b", "a b", "é", &"a".repeat(254)] {
        assert!(!is_object_name(bad), "{bad}");
    }
    assert!(is_dns_label("team-a") && is_dns_label("v1beta2"));
    for bad in ["", "-a", "a-", "A", "a.b", "v1/../x", &"a".repeat(64)] {
        assert!(!is_dns_label(bad), "{bad}");
    }
    assert!(is_dns_subdomain("a.b-c") && !is_dns_subdomain("a..b/"));
    assert!(is_kind("Widget") && is_kind("V1Thing"));
    for bad in ["", "1Widget", "Wid get", "Widget…", &"W".repeat(64)] {
        assert!(!is_kind(bad), "{bad}");
    }
}

#[test]
fn the_bucket_admits_its_rate_and_burst() {
    let (observations, _observer) = Observations::new(ObserveConfig {
        rate_per_second: 3,
        ..Default::default()
    });
    let taken = (0..10).filter(|_| observations.take_tokens(0)).count();
    assert_eq!(taken, 3);
    let (none, _observer) = Observations::new(ObserveConfig {
        rate_per_second: 0,
        ..Default::default()
    });
    assert!(!none.take_tokens(0));

    let start = Instant::now();
    let mut bucket = TokenBucket::new(2, 5, start);
    assert_eq!((0..10).filter(|_| bucket.take(start)).count(), 5, "the burst");
    let later = start + Duration::from_millis(1500);
    assert_eq!((0..10).filter(|_| bucket.take(later)).count(), 3, "2/s for 1.5 s");
    let much_later = later + Duration::from_secs(3600);
    assert_eq!(
        (0..100).filter(|_| bucket.take(much_later)).count(),
        5,
        "never past the burst"
    );
    // A clock read earlier than the last one takes nothing back.
    assert!(!bucket.take(later));
    assert!(!bucket.ready(much_later));
}

proptest! {
    /// Over any sequence of takes, the bucket gives at most its burst plus
    /// its rate times the time elapsed.
    #[test]
    fn the_bucket_never_gives_more_than_its_rate(rate in 1u32..50, burst in 1u32..50, steps in proptest::collection::vec(0u64..500, 1..200)) {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(rate, burst, start);
        let mut now = start;
        let mut taken = 0u64;
        for step in steps {
            now += Duration::from_millis(step);
            taken += u64::from(bucket.take(now));
        }
        let elapsed = now.duration_since(start).as_secs_f64();
        prop_assert!(taken as f64 <= f64::from(burst) + elapsed * f64::from(rate) + 1e-9);
    }
}

#[test]
fn the_byte_budget_is_returned_when_a_job_is_dropped() {
    let budget = ByteBudget::new(100);
    let a = budget.reserve(60).expect("fits");
    assert!(budget.reserve(41).is_none(), "over the budget");
    let b = budget.reserve(40).expect("fits exactly");
    assert_eq!(budget.used(), 100);
    assert!(budget.reserve(1).is_none());
    drop(a);
    assert_eq!(budget.used(), 40);
    assert!(budget.reserve(usize::MAX).is_none(), "no overflow");
    drop(b);
    assert_eq!(budget.used(), 0);
}

#[tokio::test]
async fn the_queue_holds_a_copy_of_the_statuses_never_the_body() {
    let rules = rules();
    let metrics = Metrics::default();
    let (observations, _observer) = Observations::new(ObserveConfig::default());
    // 4 MiB of managedFields around two small statuses.
    let body = Bytes::from(stale_review(4 * 1024 * 1024, 0));
    let decided = decision(&rules, &body);
    assert_eq!(decided.outcome, Outcome::Denied);
    observations.offer(&metrics, body.len(), copied(&rules, &body), rules.clone(), &decided);
    assert!(body.is_unique(), "the queued job shares the request's body");
    let queued = observations.budget.used();
    assert!((1..4096).contains(&queued), "the job takes {queued} bytes");
    assert_eq!(
        counter(&metrics, "statusguard_observations_skipped_total{result=\"bytes\"}"),
        None
    );
}

#[tokio::test]
async fn a_write_over_the_byte_budget_is_skipped_and_counted() {
    let rules = rules();
    let metrics = Metrics::default();
    let (observations, observer) = Observations::new(ObserveConfig {
        queue_bytes: 256 * 1024,
        ..Default::default()
    });
    // The status itself is 200 kB: one fits, the second does not (the
    // observer is not running, so nothing is taken off the queue).
    let body = Bytes::from(stale_review(0, 200 * 1024));
    let decided = decision(&rules, &body);
    observations.offer(&metrics, body.len(), copied(&rules, &body), rules.clone(), &decided);
    observations.offer(&metrics, body.len(), copied(&rules, &body), rules.clone(), &decided);
    assert_eq!(
        counter(&metrics, "statusguard_observations_skipped_total{result=\"bytes\"}"),
        Some(1.0)
    );
    let used = observations.budget.used();
    assert!((200 * 1024..256 * 1024).contains(&used), "{used}");
    // A small write still fits beside it.
    let small = Bytes::from(stale_review(0, 0));
    observations.offer(
        &metrics,
        small.len(),
        copied(&rules, &small),
        rules.clone(),
        &decision(&rules, &small),
    );
    assert_eq!(
        counter(&metrics, "statusguard_observations_skipped_total{result=\"bytes\"}"),
        Some(1.0)
    );
    // Once the observer has read the queue, the budget is whole again.
    let mut tasks = tokio::task::JoinSet::new();
    observer.spawn(Arc::new(Metrics::default()), None, &mut tasks);
    tokio::time::timeout(Duration::from_secs(5), async {
        while observations.budget.used() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the observer returns the budget");
    assert_eq!(observations.snapshot().resources[0].writers[0].writes, 2);
}

#[tokio::test]
async fn the_bytes_read_per_second_are_bounded_as_well_as_the_writes() {
    let rules = rules();
    let metrics = Metrics::default();
    let body = Bytes::from(stale_review(0, 100 * 1024));
    // Room for one and a half of these bodies a second, and writes to spare.
    let (observations, _observer) = Observations::new(ObserveConfig {
        bytes_per_second: body.len() as u64 * 3 / 2,
        ..Default::default()
    });
    let decided = decision(&rules, &body);
    assert!(observations.ready(body.len()));
    observations.offer(&metrics, body.len(), copied(&rules, &body), rules.clone(), &decided);
    assert!(observations.budget.used() > 0, "the first is taken");
    // The second waits for the bytes: not copied out, and skipped as "rate".
    assert!(!observations.ready(body.len()));
    observations.offer(&metrics, body.len(), Copied::Declined, rules.clone(), &decided);
    assert_eq!(
        counter(&metrics, "statusguard_observations_skipped_total{result=\"rate\"}"),
        Some(1.0)
    );
    // A small write still fits in what is left.
    let small = Bytes::from(stale_review(0, 0));
    assert!(observations.ready(small.len()));
    // A body larger than a second's worth is never observed.
    assert!(!observations.ready(body.len() * 2));
}

#[tokio::test]
async fn a_dry_run_is_not_queued() {
    let rules = rules();
    let metrics = Metrics::default();
    let (observations, _observer) = Observations::new(ObserveConfig::default());
    let mut review: Value = serde_json::from_slice(&stale_review(0, 0)).unwrap();
    review["request"]["dryRun"] = json!(true);
    let body = Bytes::from(serde_json::to_vec(&review).unwrap());
    observations.offer(
        &metrics,
        body.len(),
        copied(&rules, &body),
        rules.clone(),
        &decision(&rules, &body),
    );
    assert_eq!(observations.budget.used(), 0);
}

#[test]
fn the_record_says_what_it_counted() {
    let (observations, _observer) = Observations::new(ObserveConfig::default());
    let basis = observations.snapshot().basis.expect("a basis");
    assert!(!basis.authenticated_callers);
    assert_eq!(basis.rate_per_second, 200);
    assert!(humantime::parse_rfc3339(&basis.since).is_ok(), "{}", basis.since);
    let json = serde_json::to_value(observations.snapshot()).unwrap();
    assert_eq!(json["basis"]["authenticatedCallers"], false);
    assert!(json["basis"]["counted"].as_str().unwrap().contains("received"));
    let (authenticated, _observer) = Observations::new(ObserveConfig {
        authenticated_callers: true,
        ..Default::default()
    });
    assert!(authenticated.snapshot().authenticated());
}

fn limits() -> (EventLimits, Instant) {
    let now = Instant::now();
    (EventLimits::new(Duration::from_secs(5), 5, 20, now), now)
}

#[test]
fn one_event_per_object_reason_and_writer_in_the_interval() {
    let (mut limits, now) = limits();
    let claim = limits.check("uid-1", Stopped::Denied, "scaler", now).unwrap();
    limits.sent(claim, now);
    let soon = now + Duration::from_secs(1);
    assert_eq!(
        limits.check("uid-1", Stopped::Denied, "scaler", soon).unwrap_err(),
        Limit::Interval
    );
    // Another reason, writer or object is another key.
    assert!(limits.check("uid-1", Stopped::Trimmed, "scaler", soon).is_ok());
    assert!(limits.check("uid-1", Stopped::Denied, "other", soon).is_ok());
    assert!(limits.check("uid-2", Stopped::Denied, "scaler", soon).is_ok());
    assert!(
        limits
            .check("uid-1", Stopped::Denied, "scaler", now + Duration::from_secs(5))
            .is_ok()
    );
}

#[test]
fn an_object_gets_at_most_its_cap_whatever_the_writers_claimed() {
    let (mut limits, now) = limits();
    let mut at = now;
    for writer in 0..OBJECT_EVENTS {
        // Spaced out so that the global rate is never what limits.
        at += Duration::from_secs(1);
        let claim = limits
            .check("uid-1", Stopped::Denied, &format!("w{writer}"), at)
            .unwrap();
        limits.sent(claim, at);
    }
    at += Duration::from_secs(1);
    assert_eq!(
        limits.check("uid-1", Stopped::Denied, "yet-another", at).unwrap_err(),
        Limit::Object
    );
    assert!(limits.check("uid-2", Stopped::Denied, "yet-another", at).is_ok());
    // A new window.
    assert!(
        limits
            .check(
                "uid-1",
                Stopped::Denied,
                "yet-another",
                now + OBJECT_WINDOW + Duration::from_secs(1)
            )
            .is_ok()
    );
}

#[test]
fn events_in_all_are_limited_to_the_rate_and_a_check_alone_costs_nothing() {
    let (mut limits, now) = limits();
    // Checks of objects that are then not found take no token.
    for i in 0..1000 {
        assert!(limits.check(&format!("forged-{i}"), Stopped::Denied, "x", now).is_ok());
    }
    let mut sent = 0;
    for i in 0..100 {
        match limits.check(&format!("uid-{i}"), Stopped::Denied, "x", now) {
            Ok(claim) => {
                limits.sent(claim, now);
                sent += 1;
            }
            Err(limit) => assert_eq!(limit, Limit::Rate),
        }
    }
    assert_eq!(sent, 20, "the burst");
    let second = now + Duration::from_secs(1);
    let mut more = 0;
    for i in 100..200 {
        if let Ok(claim) = limits.check(&format!("uid-{i}"), Stopped::Denied, "x", second) {
            limits.sent(claim, second);
            more += 1;
        }
    }
    assert_eq!(more, 5, "the rate");
}

#[tokio::test]
async fn an_event_is_sent_only_for_a_review_that_names_a_readable_object() {
    // The checks that need no API server: no uid, or names that cannot be
    // an object's. (The read itself is tested against a real API server:
    // tests/e2e_events.rs.)
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
    let facts = WriteFacts {
        writer: "x".into(),
        group: "example.com".into(),
        version: "v1".into(),
        resource: "widgets".into(),
        kind: "Widget".into(),
        name: "w1".into(),
        namespace: Some("team-a".into()),
        uid: None,
        dry_run: false,
    };
    assert!(matches!(find_object(&client, &facts).await, Found::Nothing(_)));
    for bad in [
        WriteFacts {
            name: "../../secrets/x".into(),
            uid: Some("u".into()),
            ..facts.clone()
        },
        WriteFacts {
            version: "v1/namespaces/kube-system".into(),
            uid: Some("u".into()),
            ..facts.clone()
        },
        WriteFacts {
            namespace: Some("a/b".into()),
            uid: Some("u".into()),
            ..facts.clone()
        },
        WriteFacts {
            kind: "Widget…".into(),
            uid: Some("u".into()),
            ..facts.clone()
        },
    ] {
        assert!(matches!(find_object(&client, &bad).await, Found::Nothing(_)), "{bad:?}");
    }
    // A name that could exist is read: here no API server answers.
    let readable = WriteFacts {
        uid: Some("u".into()),
        ..facts
    };
    assert!(matches!(find_object(&client, &readable).await, Found::Failed(_)));
}
