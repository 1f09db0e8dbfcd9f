# `cmake --install build --prefix P`: the engine as a library (find_package(troupe) with
# CMAKE_PREFIX_PATH=P, then link troupe::engine and include <troupe/troupe.h>), and the
# `troupe` command. Included by the top-level CMakeLists.txt once every target is defined.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public headers: troupe.h and what it includes, nothing more (no CAF, ZeroMQ or engine
# internals; a custom layer needs layer.h, layer_registry.h, backend.h and tensor.h, all here).
# They keep their folders under include/troupe/. tests/apps/installed_headers_test.sh checks that
# an installed prefix holds exactly these and that each compiles on its own against it.
set(troupe_public_headers
    actors/cluster/cluster_host.h
    actors/config/job_config.h
    actors/config/job_data.h
    actors/config/job_file.h
    actors/config/model_graph.h
    actors/engine/run_monitor.h
    actors/engine/run_reports.h
    actors/engine/trace_recorder.h
    actors/hosts/pipeline_host.h
    actors/hosts/steady_clock.h
    actors/storage/checkpoint_manifest.h
    actors/storage/checkpoint_store.h
    actors/storage/file_system.h
    layers/backend.h
    layers/dataset.h
    layers/instance.h
    layers/layer.h
    layers/layer_registry.h
    layers/layer_spec.h
    layers/optimizer_kind.h
    layers/tensor.h
    transport/curve_keys.h)

set(troupe_library_targets troupe_layers troupe_transport troupe_config troupe_engine
                           troupe_storage troupe_hosts troupe_cluster troupe_actors)
if(TROUPE_WITH_CUDA)
  list(APPEND troupe_library_targets troupe_layers_cuda)
endif()
install(TARGETS ${troupe_library_targets} EXPORT troupeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} INCLUDES DESTINATION include)
install(TARGETS troupe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES apps/plot/troupe_plot.py DESTINATION ${CMAKE_INSTALL_DATADIR}/troupe)
foreach(header IN LISTS troupe_public_headers)
  get_filename_component(folder ${header} DIRECTORY)
  install(FILES ${header} DESTINATION include/troupe/${folder})
endforeach()
install(FILES actors/troupe.h DESTINATION include/troupe)
list(JOIN troupe_public_headers "\n" troupe_public_header_lines)
file(WRITE ${PROJECT_BINARY_DIR}/troupe_public_headers.txt "troupe.h\n${troupe_public_header_lines}\n")
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
configure_package_config_file(cmake/troupeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/troupeConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake
              ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
