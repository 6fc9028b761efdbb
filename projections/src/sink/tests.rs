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

/// `/readyz` reads how long the gate has been held: set while a holder
/// has it, cleared when the guard drops, and the projector's side of the
/// lock is free again.
#[tokio::test]
async fn the_gate_says_how_long_it_is_held() {
    let gate = ProjectorGate::new();
    assert_eq!(gate.held_for(), None);
    let guard = gate.hold().await;
    assert!(gate.held_for().is_some());
    assert!(gate.lock.try_read().is_err(), "held: the projector waits");
    drop(guard);
    assert_eq!(gate.held_for(), None);
    assert!(gate.lock.try_read().is_ok());
}
