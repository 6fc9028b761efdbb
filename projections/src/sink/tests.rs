use super::*;

#[test]
fn backoff_doubles_up_to_the_cap() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
    let d: Vec<u128> = (0..4).map(|_| b.delay().as_millis()).collect();
    assert!((100..=125).contains(&d[0]), "{d:?}");
    assert!((200..=250).contains(&d[1]), "{d:?}");
    assert!((400..=500).contains(&d[2]), "{d:?}");
    assert!((400..=500).contains(&d[3]), "{d:?}");
    b.reset();
    assert!(b.delay() < Duration::from_millis(130));
}

#[test]
fn status_age_is_computed_from_the_event_time() {
    let mut s = SinkStatus::new();
    let now = Utc::now();
    assert_eq!(s.seconds_behind_at(now), 0.0);
    s.oldest_unprojected = Some(now - chrono::Duration::seconds(3));
    assert!((s.seconds_behind_at(now) - 3.0).abs() < 0.01);
}
