# helpdoc.cmake - runs PROG --help and packaging/helpdoc.awk over its output
# twice: the man page OUT_MAN and the bash completion OUT_BASH (cmake -P,
# from packaging/CMakeLists.txt at build time).
#   -DPROG= -DNAME= -DAWK= -DSCRIPT= -DOUT_MAN= -DOUT_BASH= -DVERSION=
#   -DDATE= -DSUMMARY= -DDESCRIPTION= -DSEEALSO=
set(help "${OUT_MAN}.help")
execute_process(COMMAND "${PROG}" --help OUTPUT_FILE "${help}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROG} --help failed (${rc})")
endif()
execute_process(
  COMMAND "${AWK}" -f "${SCRIPT}" -v mode=man -v "prog=${NAME}"
          -v "version=${VERSION}" -v "date=${DATE}" -v "summary=${SUMMARY}"
          -v "description=${DESCRIPTION}" -v "seealso=${SEEALSO}"
  INPUT_FILE "${help}" OUTPUT_FILE "${OUT_MAN}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "helpdoc.awk (man) failed for ${NAME}")
endif()
execute_process(
  COMMAND "${AWK}" -f "${SCRIPT}" -v mode=bash -v "prog=${NAME}"
  INPUT_FILE "${help}" OUTPUT_FILE "${OUT_BASH}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "helpdoc.awk (bash) failed for ${NAME}")
endif()
file(REMOVE "${help}")
