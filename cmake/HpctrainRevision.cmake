# Script mode (cmake -DSOURCE_DIR=... -DOUT=... [-DREVISION=...] -P HpctrainRevision.cmake), run
# at every build: writes OUT, '#define HPCTRAIN_REVISION "..."', only when its text changes (so a
# build at the same revision recompiles nothing). The revision is REVISION where given (a package
# built from a tarball: -DHPCTRAIN_REVISION=...), else the source tree's commit, 12 hex digits,
# with "-dirty" when tracked files differ from it, else "unknown" (no git, or SOURCE_DIR is not the
# top of its own repository but a folder inside another project's).
if(NOT REVISION)
  set(REVISION unknown)
  execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --show-toplevel --short=12 HEAD
                  OUTPUT_VARIABLE said RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0)
    string(REPLACE "\n" ";" said "${said}")
    list(LENGTH said n)
    if(n EQUAL 2)
      list(GET said 0 top)
      list(GET said 1 commit)
      get_filename_component(top "${top}" REALPATH)
      get_filename_component(here "${SOURCE_DIR}" REALPATH)
      if(top STREQUAL here AND commit MATCHES "^[0-9a-f]+$")
        set(REVISION "${commit}")
        execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
                        OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
        if(NOT rc EQUAL 0 OR NOT changes STREQUAL "")
          set(REVISION "${REVISION}-dirty")
        endif()
      endif()
    endif()
  endif()
endif()
if(NOT REVISION MATCHES "^[A-Za-z0-9._+~-]+$")
  message(FATAL_ERROR "HPCTRAIN_REVISION='${REVISION}': letters, digits and ._+~- only")
endif()
set(text "#define HPCTRAIN_REVISION \"${REVISION}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
