//! Tests of the HTTP counters and the `/metrics` rendering.

use super::*;

#[test]
fn responses_are_counted_by_protocol_and_code() {
    let metrics = Arc::new(HttpMetrics::default());
    metrics.respond(Protocol::Pico, Response::new(200));
    metrics.respond(Protocol::DurableStreams, Response::new(204));
    metrics.respond(Protocol::DurableStreams, Response::new(299));
    let engine: NodeMetrics = Arc::new(vec![Arc::new(CoreMetrics::default())]);
    let text = render(
        crate::config::BuildInfo::default(),
        &engine,
        0,
        0,
        &[metrics],
        &StorageUsage::default(),
        1.0,
    );
    assert!(text.contains("pico_http_responses_total{core=\"0\",protocol=\"pico\",code=\"200\"} 1"));
    assert!(text.contains("pico_http_responses_total{core=\"0\",protocol=\"ds\",code=\"204\"} 1"));
    assert!(text.contains("pico_http_responses_total{core=\"0\",protocol=\"ds\",code=\"other\"} 1"));
    assert!(text.contains("pico_op_latency_seconds_bucket{core=\"0\",op=\"append\",le=\"+Inf\"} 0"));
    // Every sample line belongs to a declared family.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        let family = name
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count");
        assert!(text.contains(&format!("# TYPE {family} ")), "{line}");
    }
}

#[test]
fn storage_usage_is_rendered_once_measured() {
    let engine: NodeMetrics = Arc::new(vec![Arc::new(CoreMetrics::default())]);
    let http = [Arc::new(HttpMetrics::default())];
    let build = crate::config::BuildInfo::default();
    let unmeasured = render(build, &engine, 0, 0, &http, &StorageUsage::default(), 1.0);
    assert!(unmeasured.contains("# TYPE pico_disk_bytes gauge"));
    assert!(!unmeasured.contains("pico_disk_bytes{"));
    assert!(!unmeasured.contains("\npico_bucket_bytes "));
    let usage = StorageUsage {
        wal_bytes: Some(4096),
        meta_bytes: None,
        bucket: Some(pico_meta::CatalogUsage {
            segments: 3,
            bytes: 5_000_000_000,
        }),
        measured_at_ms: Some(1),
    };
    let text = render(build, &engine, 0, 0, &http, &usage, 1.0);
    assert!(text.contains("\npico_disk_bytes{dir=\"wal\"} 4096\n"));
    assert!(!text.contains("pico_disk_bytes{dir=\"meta\"}"));
    assert!(text.contains("\npico_bucket_bytes 5000000000\n"));
    assert!(text.contains("\npico_bucket_segments 3\n"));
    // Each family's samples directly follow its own header.
    let at = |needle: &str| text.find(needle).unwrap();
    assert!(at("# TYPE pico_bucket_bytes") < at("\npico_bucket_bytes "));
    assert!(at("\npico_bucket_bytes ") < at("# HELP pico_bucket_segments"));
}

#[test]
fn refusals_errors_and_client_errors_are_told_apart() {
    let (a, b) = (
        Arc::new(HttpMetrics::default()),
        Arc::new(HttpMetrics::default()),
    );
    for (metrics, protocol, code) in [
        (&a, Protocol::Pico, 200),
        (&a, Protocol::Pico, 404),
        (&b, Protocol::DurableStreams, 400),
        (&a, Protocol::Pico, 413),
        (&b, Protocol::DurableStreams, 429),
        (&b, Protocol::Pico, 429),
        (&a, Protocol::Pico, 503),
        (&b, Protocol::Pico, 507),
        (&a, Protocol::Pico, 500),
        (&b, Protocol::DurableStreams, 502),
        (&b, Protocol::Pico, 299),
    ] {
        metrics.respond(protocol, Response::new(code));
    }
    let counts = ResponseCounts::of(&[a, b]);
    assert_eq!(counts.total(), 11);
    assert_eq!(counts.other, 1);
    assert_eq!(counts.server_errors(), 2, "500 and 502");
    assert_eq!(counts.client_errors(), 2, "404 and 400");
    assert_eq!(
        counts.refusals(),
        [(413, 1), (429, 2), (431, 0), (503, 1), (507, 1)]
    );
}

#[test]
fn merged_histograms_add_every_cores_samples() {
    let (a, b) = (Histogram::default(), Histogram::default());
    a.observe(std::time::Duration::from_micros(40));
    b.observe(std::time::Duration::from_micros(40));
    b.observe(std::time::Duration::from_millis(2));
    let (buckets, sum_us, count) = merged_histogram([&a, &b].into_iter());
    assert_eq!(count, 3);
    assert_eq!(sum_us, 2_080);
    assert_eq!(buckets.len(), LATENCY_BUCKETS_US.len() + 1);
    assert_eq!(buckets[0], 2, "≤ 50 µs");
    assert_eq!(buckets[5], 3, "≤ 2.5 ms");
    assert_eq!(*buckets.last().unwrap(), 3);
}
