# What `cmake --install` puts where (GNU layout under CMAKE_INSTALL_PREFIX), and the Debian packages
# cpack makes from it (`cpack -G DEB` in the build directory). tests/package/package_test.sh
# checks and lints them, installs hpctrain with dpkg into a fresh root without CUDA and runs the
# programs there, and builds a CMake project against hpctrain-dev.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The packages, as CMake install components (cpack -G DEB makes one package of each):
#   hpctrain       the programs built without CUDA, the scripts, docs and man pages: it needs
#                  only Debian's packages, so it installs and runs on any host
#   hpctrain-cuda  the same files with the CUDA hpctrain, when this build trains on GPUs; it
#                  takes hpctrain's place (Provides, Conflicts, Replaces) and depends on NVIDIA's
#                  packages by their names in NVIDIA's apt repository
#   hpctrain-dev   the library's headers, static archives and CMake package
# `cmake --install build` installs all of them; with CUDA its hpctrain is the CUDA one (installed
# last, over the other). EXCLUDE_FROM_ALL keeps hpctrain-cuda's copies of the common files out
# of that plain install, which already has them.
set(HPCTRAIN_PACKAGES hpctrain hpctrain-dev)
if(HPCTRAIN_GPU_TRAINING)
  list(APPEND HPCTRAIN_PACKAGES hpctrain-cuda)
endif()

# The scripts as installed: run by Debian's python3 (a dependency of the packages), not by the
# first python3 on the user's PATH (a virtual environment's, say), as from a checkout.
set(HPCTRAIN_INSTALLED_SCRIPTS ${CMAKE_BINARY_DIR}/installed-scripts)
foreach(script datasets/hpcdata launch/hpctrain-plot)
  file(READ ${PROJECT_SOURCE_DIR}/${script} text)
  string(REGEX REPLACE "^#!/usr/bin/env python3\n" "#!/usr/bin/python3\n" text "${text}")
  # hpctrain-plot's --version: the project's, written in (no CMakeLists.txt beside it there).
  string(REPLACE "\nINSTALLED_VERSION = None\n" "\nINSTALLED_VERSION = \"${PROJECT_VERSION}\"\n" text "${text}")
  get_filename_component(name ${script} NAME)
  file(WRITE ${HPCTRAIN_INSTALLED_SCRIPTS}/${name} "${text}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${script})
endforeach()

# The README as installed: its links lead to the files beside it in the documentation directory
# (docs/aws.md is aws.md there, slurm/README.md slurm.md, as installed below); bench/README.md is
# not installed, and is named as the source tree's.
set(HPCTRAIN_INSTALLED_DOCS ${CMAKE_BINARY_DIR}/installed-docs)
file(READ ${PROJECT_SOURCE_DIR}/README.md text)
foreach(pair slurm/README.md=slurm.md launch/README.md=launch.md datasets/README.md=datasets.md
             docs/aws.md=aws.md docs/performance.md=performance.md)
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 from)
  list(GET pair 1 to)
  string(REPLACE "[${from}](${from})" "[${to}](${to})" text "${text}")
  string(REPLACE "](${from})" "](${to})" text "${text}")
endforeach()
string(REGEX REPLACE "\\[([^]\n]*)\\]\\(bench/README\\.md(#[^)]*)?\\)" "\\1 (in the source tree; not installed)" text "${text}")
file(WRITE ${HPCTRAIN_INSTALLED_DOCS}/README.md "${text}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/README.md)

# Debian's files of each package: its copyright (DEP-5) and changelog, gzip -9n (no name or
# time in the header: the same bytes on every build), and lintian's overrides, each with why.
# In the packages only (EXCLUDE_FROM_ALL: not in a plain `cmake --install`).
set(changelog ${CMAKE_BINARY_DIR}/debian/changelog.Debian.gz)
add_custom_command(OUTPUT ${changelog}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/debian
  COMMAND gzip -9nc ${PROJECT_SOURCE_DIR}/cmake/debian/changelog > ${changelog}
  DEPENDS ${PROJECT_SOURCE_DIR}/cmake/debian/changelog VERBATIM)
add_custom_target(debian_changelog ALL DEPENDS ${changelog})
function(hpctrain_install_debian_files package)
  set(doc ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package})
  install(FILES cmake/debian/copyright ${changelog} DESTINATION ${doc} COMPONENT ${package} EXCLUDE_FROM_ALL)
  if(EXISTS ${PROJECT_SOURCE_DIR}/cmake/debian/lintian/${package})
    install(FILES cmake/debian/lintian/${package} DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides
            COMPONENT ${package} EXCLUDE_FROM_ALL)
  endif()
endfunction()

# The programs, scripts and docs of a runtime package, with the given hpctrain. hpcdata finds
# hpcdata-pack beside itself or on PATH; the Slurm scripts find job.sh and hpcdata below
# HPCTRAIN_HOME (share/hpctrain: the tree's layout) and the programs on PATH.
function(hpctrain_install_runtime package hpctrain_target)
  set(common COMPONENT ${package})
  if(NOT package STREQUAL "hpctrain")
    list(APPEND common EXCLUDE_FROM_ALL)
  endif()
  install(TARGETS ${hpctrain_target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${package})
  install(TARGETS hpcrun hpcdata-pack RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} ${common})
  install(PROGRAMS ${HPCTRAIN_INSTALLED_SCRIPTS}/hpcdata ${HPCTRAIN_INSTALLED_SCRIPTS}/hpctrain-plot
          DESTINATION ${CMAKE_INSTALL_BINDIR} ${common})
  install(PROGRAMS slurm/train.sbatch slurm/sweep.sbatch slurm/chain.sh slurm/local-cluster.sh slurm/epilog.sh
          DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/slurm ${common})
  install(FILES slurm/job.sh DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/slurm ${common})  # sourced, not run
  install(PROGRAMS ${HPCTRAIN_INSTALLED_SCRIPTS}/hpcdata DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/datasets ${common})
  install(FILES ${HPCTRAIN_INSTALLED_DOCS}/README.md docs/aws.md docs/performance.md DESTINATION ${CMAKE_INSTALL_DOCDIR} ${common})
  foreach(room slurm launch datasets)  # each room's README.md, by the room's name
    install(FILES ${room}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME ${room}.md ${common})
  endforeach()
  if(HELP2MAN)
    install(FILES ${HPCTRAIN_MAN_PAGES} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 ${common})
  endif()
  hpctrain_install_debian_files(${package})
endfunction()

# Man pages, made from each program's --help by help2man at build time: hpctrain's from the
# hpctrain without CUDA (the same options; the pages are the same in both runtime packages).
find_program(HELP2MAN help2man)
if(HELP2MAN)
  set(pages)
  # hpctrain's subcommands, every option of each (docs/man/commands.sh), for its page.
  set(commands_h2m ${CMAKE_BINARY_DIR}/man/hpctrain-commands.h2m)
  add_custom_command(OUTPUT ${commands_h2m}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND bash ${PROJECT_SOURCE_DIR}/docs/man/commands.sh $<TARGET_FILE:${HPCTRAIN_CPU_PROGRAM}> ${commands_h2m}
    DEPENDS ${HPCTRAIN_CPU_PROGRAM} ${PROJECT_SOURCE_DIR}/docs/man/commands.sh VERBATIM)
  # hpcdata's commands likewise (pack's options are hpcdata-pack's: this build's, not another
  # build/ in the checkout).
  set(hpcdata_commands_h2m ${CMAKE_BINARY_DIR}/man/hpcdata-commands.h2m)
  add_custom_command(OUTPUT ${hpcdata_commands_h2m}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND ${CMAKE_COMMAND} -E env HPCDATA_PACK=$<TARGET_FILE:hpcdata-pack>
            bash ${PROJECT_SOURCE_DIR}/docs/man/commands.sh ${PROJECT_SOURCE_DIR}/datasets/hpcdata ${hpcdata_commands_h2m}
    DEPENDS hpcdata-pack ${PROJECT_SOURCE_DIR}/datasets/hpcdata ${PROJECT_SOURCE_DIR}/docs/man/commands.sh VERBATIM)
  set(man_dir ${PROJECT_SOURCE_DIR}/docs/man)
  # name, command, one-line description, more help2man arguments (^-separated): the version is
  # the project's (not --version's text, which names the build machine's GPUs), and the pages of
  # hpctrain and hpcrun include EXIT STATUS, SIGNALS, ENVIRONMENT, FILES, EXAMPLES (docs/man).
  foreach(entry "hpctrain|$<TARGET_FILE:${HPCTRAIN_CPU_PROGRAM}>|data-parallel training of image classifiers on CPUs and GPUs|--include=${man_dir}/hpctrain.h2m^--include=${commands_h2m}"
                "hpcrun|$<TARGET_FILE:hpcrun>|launch and supervise an MPI training job across hosts|--include=${man_dir}/hpcrun.h2m"
                "hpcdata|${PROJECT_SOURCE_DIR}/datasets/hpcdata|prepare, pack and stage datasets for hpctrain|--include=${hpcdata_commands_h2m}"
                "hpcdata-pack|$<TARGET_FILE:hpcdata-pack>|pack an image folder into shards for hpctrain|"
                "hpctrain-plot|${PROJECT_SOURCE_DIR}/launch/hpctrain-plot|charts of hpctrain metrics files|")
    string(REPLACE "|" ";" fields "${entry}")
    list(GET fields 0 name)
    list(GET fields 1 program)
    list(GET fields 2 what)
    list(GET fields 3 extra)
    string(REPLACE "^" ";" extra "${extra}")
    set(depends ${program})
    foreach(arg IN LISTS extra)
      if(arg MATCHES "^--include=(.*)$")
        list(APPEND depends ${CMAKE_MATCH_1})
      endif()
    endforeach()
    set(page ${CMAKE_BINARY_DIR}/man/${name}.1)
    # OMPI_ALLOW_RUN_AS_ROOT: --help starts MPI (a world of one), which Open MPI refuses to root.
    # Compressed, as Debian ships man pages (gzip -n: the same bytes on every build).
    add_custom_command(OUTPUT ${page}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${CMAKE_COMMAND} -E env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
              ${HELP2MAN} --no-info --no-discard-stderr --name=${what} --version-string=${PROJECT_VERSION} ${extra}
              --output=${page} ${program}
      COMMAND gzip -9nf ${page}
      DEPENDS ${depends} VERBATIM)
    list(APPEND pages ${page}.gz)
  endforeach()
  add_custom_target(man_pages ALL DEPENDS ${pages})
  add_dependencies(man_pages ${HPCTRAIN_CPU_PROGRAM} hpcrun hpcdata-pack)  # built before help2man runs them
  set(HPCTRAIN_MAN_PAGES ${pages})
else()
  message(WARNING "help2man not found: no man pages will be made or installed (apt-get install help2man)")
endif()
hpctrain_install_runtime(hpctrain ${HPCTRAIN_CPU_PROGRAM})
if(HPCTRAIN_GPU_TRAINING)
  hpctrain_install_runtime(hpctrain-cuda hpctrain)
endif()

# The library, its headers (include/hpctrain/<room>/*.hpp, included as "core/duration.hpp") and
# a CMake package: find_package(hpctrain) gives hpctrain::hpctrain_lib, with every backend this
# build has (with CUDA, its users need NVIDIA's development packages too).
set(HPCTRAIN_EXPORTED hpctrain_lib hpctrain_usage hpctrain_dnnl)
if(HPCTRAIN_GPU_TRAINING)
  list(APPEND HPCTRAIN_EXPORTED hpctrain_kernels)
endif()
install(TARGETS ${HPCTRAIN_EXPORTED} EXPORT hpctrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        COMPONENT hpctrain-dev)
install(DIRECTORY src/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hpctrain COMPONENT hpctrain-dev FILES_MATCHING PATTERN "*.hpp")
install(FILES kernels/kernels.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hpctrain/kernels COMPONENT hpctrain-dev)
set(HPCTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hpctrain)
install(EXPORT hpctrainTargets NAMESPACE hpctrain:: DESTINATION ${HPCTRAIN_CMAKE_DIR} COMPONENT hpctrain-dev)
configure_package_config_file(cmake/hpctrainConfig.cmake.in ${CMAKE_BINARY_DIR}/hpctrainConfig.cmake
                              INSTALL_DESTINATION ${HPCTRAIN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/hpctrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/hpctrainConfig.cmake ${CMAKE_BINARY_DIR}/hpctrainConfigVersion.cmake
        DESTINATION ${HPCTRAIN_CMAKE_DIR} COMPONENT hpctrain-dev)
hpctrain_install_debian_files(hpctrain-dev)

# The Debian packages (cpack -G DEB in the build directory), one per component.
set(CPACK_PACKAGE_NAME hpctrain)
set(CPACK_PACKAGE_VENDOR "hpctrain")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# The packages' version: the project's, and the Debian revision of cmake/debian/changelog's top
# entry (0.1.0-1: a change of the packaging alone gets a new revision, not a new version).
file(STRINGS cmake/debian/changelog top LIMIT_COUNT 1)
if(top MATCHES "^hpctrain \\(([^)]+)-([^)-]+)\\) ")
  set(CPACK_DEBIAN_PACKAGE_RELEASE ${CMAKE_MATCH_2})
  if(NOT CMAKE_MATCH_1 STREQUAL PROJECT_VERSION)
    message(WARNING "cmake/debian/changelog's top entry is for ${CMAKE_MATCH_1}-${CMAKE_MATCH_2}, the project is "
                    "${PROJECT_VERSION}: add an entry for ${PROJECT_VERSION}-1 (the package test fails until then)")
  endif()
else()
  message(FATAL_ERROR "cmake/debian/changelog begins '${top}', not 'hpctrain (VERSION-REVISION) ...'")
endif()
set(HPCTRAIN_DEB_VERSION ${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${HPCTRAIN_PACKAGES})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "hpctrain maintainers <hpctrain@localhost>")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# dpkg-shlibdeps names the Debian packages of the shared libraries the programs need. It cannot
# name those of a CUDA toolkit installed from NVIDIA's .run file (no package owns them), and CPack
# lets it drop them without a word: hpctrain-cuda names them itself, below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(runtime_depends "openmpi-bin, python3")  # mpirun for hpcrun; python3 for hpcdata and hpctrain-plot
# Descriptions: a synopsis, then lines CPack indents as Debian's control file wants them.
string(CONCAT description_tail
  "hpctrain trains image classifiers data-parallel across hosts with MPI:\n"
  "hpctrain (training, evaluation, export to ONNX, prediction), hpcrun\n"
  "(launches and supervises a job across hosts, relaunching after failures),\n"
  "hpcdata (prepares, packs and stages datasets), hpctrain-plot (charts of\n"
  "the metrics), and Slurm scripts.")
foreach(package hpctrain hpctrain-cuda)
  string(TOUPPER ${package} P)
  set(CPACK_DEBIAN_${P}_PACKAGE_NAME ${package})
  set(CPACK_DEBIAN_${P}_PACKAGE_RECOMMENDS "python3-matplotlib, dataset-fashion-mnist, awscli")
  set(CPACK_DEBIAN_${P}_PACKAGE_SUGGESTS "slurm-wlm")
  # The binaries stripped, their symbols and debug information in package-dbgsym (a .ddeb):
  # CPack splits them out with objcopy. Full debug information needs -DHPCTRAIN_DEBUG_INFO=ON.
  set(CPACK_DEBIAN_${P}_DEBUGINFO_PACKAGE ON)
endforeach()
set(CPACK_DEBIAN_HPCTRAIN_PACKAGE_DEPENDS "${runtime_depends}")
set(CPACK_DEBIAN_HPCTRAIN_DESCRIPTION "data-parallel trainer for HPC clusters (CPU)\n${description_tail}\n\nThis package trains on CPUs; hpctrain-cuda also trains on NVIDIA GPUs.")
# NVIDIA's apt repository names its packages by the CUDA version this build found: the CUDA
# runtime cuda-cudart-13-0, cuBLAS (libcublas.so.13 and libcublasLt.so.13) libcublas-13-0, cuDNN
# by its major and CUDA's major (libcudnn9-cuda-13), NCCL libnccl2; the -dev ones likewise.
if(HPCTRAIN_HAVE_CUDA)
  set(cuda "${CUDAToolkit_VERSION_MAJOR}-${CUDAToolkit_VERSION_MINOR}")
  set(nvidia_depends "cuda-cudart-${cuda}, libcublas-${cuda}")
  set(nvidia_dev_depends "cuda-cudart-dev-${cuda}, libcublas-dev-${cuda}")
  if(HPCTRAIN_HAVE_CUDNN)
    string(APPEND nvidia_depends ", libcudnn${HPCTRAIN_CUDNN_MAJOR}-cuda-${CUDAToolkit_VERSION_MAJOR}")
    string(APPEND nvidia_dev_depends ", libcudnn${HPCTRAIN_CUDNN_MAJOR}-dev-cuda-${CUDAToolkit_VERSION_MAJOR}")
  endif()
  if(HPCTRAIN_HAVE_NCCL)
    string(APPEND nvidia_depends ", libnccl2")
    string(APPEND nvidia_dev_depends ", libnccl-dev")
  endif()
endif()
if(HPCTRAIN_GPU_TRAINING)
  set(CPACK_DEBIAN_HPCTRAIN-CUDA_PACKAGE_DEPENDS "${runtime_depends}, ${nvidia_depends}")
  set(CPACK_DEBIAN_HPCTRAIN-CUDA_PACKAGE_PROVIDES "hpctrain (= ${HPCTRAIN_DEB_VERSION})")
  # nvJPEG (libnvjpeg.so.13, loaded at run time: --jpeg-decode auto or gpu): JPEG shards decoded on the GPU.
  # Without it, the loader's threads decode (one info line), so only recommended.
  string(APPEND CPACK_DEBIAN_HPCTRAIN-CUDA_PACKAGE_RECOMMENDS ", libnvjpeg-${cuda}")
  set(CPACK_DEBIAN_HPCTRAIN-CUDA_PACKAGE_CONFLICTS "hpctrain")
  set(CPACK_DEBIAN_HPCTRAIN-CUDA_PACKAGE_REPLACES "hpctrain")
  set(CPACK_DEBIAN_HPCTRAIN-CUDA_DESCRIPTION "data-parallel trainer for HPC clusters (CUDA)\n${description_tail}\n\nThis package trains on NVIDIA GPUs (CUDA ${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}, cuDNN, NCCL) and on\nCPUs. It needs NVIDIA's driver and apt repository.")
endif()
# hpctrain-dev: what hpctrainConfig.cmake finds (find_dependency) and the libraries the exported
# targets name by path, and a runtime package of the same version.
set(CPACK_DEBIAN_HPCTRAIN-DEV_PACKAGE_NAME hpctrain-dev)
set(CPACK_DEBIAN_HPCTRAIN-DEV_PACKAGE_SECTION libdevel)
set(dev_depends "hpctrain (= ${HPCTRAIN_DEB_VERSION}) | hpctrain-cuda (= ${HPCTRAIN_DEB_VERSION}), libboost-program-options-dev, libopenmpi-dev, libopenblas-dev, libturbojpeg0-dev, libpng-dev, nlohmann-json3-dev, libprotobuf-dev, libonnx-dev, libisal-dev, libdnnl-dev")
if(HPCTRAIN_HAVE_CUDA)
  string(APPEND dev_depends ", ${nvidia_dev_depends}")
endif()
set(CPACK_DEBIAN_HPCTRAIN-DEV_PACKAGE_DEPENDS "${dev_depends}")
set(CPACK_DEBIAN_HPCTRAIN-DEV_DESCRIPTION "data-parallel trainer for HPC clusters (library)\nThe hpctrain library, static, with its headers and a CMake package:\nfind_package(hpctrain) and link hpctrain::hpctrain_lib.")
# cpack warns when the programs are built for this machine's CPU only (HPCTRAIN_NATIVE).
set(CPACK_HPCTRAIN_NATIVE ${HPCTRAIN_NATIVE})
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/cmake/HpctrainCPackChecks.cmake)
# Between installing each package's files and packing them: the library search paths Debian's
# packages do not need (cmake/HpctrainPackageRunpath.cmake).
set(CPACK_PRE_BUILD_SCRIPTS ${PROJECT_SOURCE_DIR}/cmake/HpctrainPackageRunpath.cmake)
include(CPack)
