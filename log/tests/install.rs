//! Installing the subscriber (its own test binary: the subscriber is process-wide).

use tracing::Level;

#[test]
fn installs_once_then_reports_the_existing_subscriber() {
    assert!(!tracing::enabled!(Level::ERROR), "no subscriber yet");
    // A bad filter still installs the default, and says why it did not use the text.
    match mscclpp_log::init_with(Some("mscclpp_host=loud")) {
        Err(mscclpp_log::Error::Filter { value, .. }) => assert_eq!(value, "mscclpp_host=loud"),
        other => panic!("{other:?}"),
    }
    assert!(tracing::enabled!(Level::WARN) && !tracing::enabled!(Level::INFO));
    // A second subscriber is refused, and the first one stays.
    match mscclpp_log::init_with(Some("trace")) {
        Err(mscclpp_log::Error::AlreadyInstalled { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(tracing::enabled!(Level::WARN) && !tracing::enabled!(Level::DEBUG));
}
