# Unity builds (GPUMIGRATE_UNITY, on by default): each target's sources are
# compiled in batches of 8 per translation unit, so the heavy headers (CLI11,
# nlohmann-json, fmt, gtest, protobuf) are parsed and their inline code
# generated once per batch rather than once per file (README "Build times").
#
# The files below define a name at file scope (in an anonymous namespace, or
# static) that another file of the same target defines too, or include a header
# that clashes with another file's (linux/tcp.h beside netinet/tcp.h): each is
# compiled on its own. A file that collides later fails the unity build, naming
# both places; rename the helper or add the file here.
set(gm_unity_alone
  cli/estimate_plot.cc
  cli/migration_plot.cc
  engine/estimator/host_profile.cc
  engine/planner/placement.cc
  perf/inprocess_migration.cc
  qemu-plugin/qmp_client.cc
  tests/fault/checkpoint/damage_test.cc
  tests/fault/session/liveness_faults_test.cc
  tests/fault/session/resume_test.cc
  tests/integration/devices/proc/proc_device_test.cc
  tests/integration/vfio/vfio_p2p_migration_test.cc
  tests/support/vfio/fake_dma_logging.cc
  tests/support/vfio/fake_vfio_device.cc
  tests/unit/codec/bf16_codec_test.cc
  tests/unit/codec/registry_test.cc
  tests/unit/devices/vfio/fake_dma_logging_test.cc
  tests/unit/devices/vfio/fake_vfio_device_test.cc
  tests/unit/estimator/beside_test.cc
  tests/unit/estimator/path_calibration_test.cc
  tests/unit/planner/placement_test.cc
  tests/unit/session/destination_protocol_test.cc
  tests/unit/session/frame_sender_test.cc
  tests/unit/session/liveness_test.cc
  tests/unit/session/page_classifier_test.cc
  tests/unit/session/scrub_test.cc
  transport/net/tcp_info.cc)
list(TRANSFORM gm_unity_alone PREPEND ${PROJECT_SOURCE_DIR}/)
# In every folder whose targets compile sources (the top one and those added).
get_directory_property(gm_unity_dirs DIRECTORY ${PROJECT_SOURCE_DIR} SUBDIRECTORIES)
set_source_files_properties(${gm_unity_alone} DIRECTORY ${PROJECT_SOURCE_DIR} ${gm_unity_dirs}
  PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
